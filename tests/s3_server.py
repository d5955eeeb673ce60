"""An S3 endpoint of the tests' own: moto's server mode on a free loopback port.

What s3fs's own test suite runs against. ``start()`` waits until it answers, ``stop()`` ends it
(and ``start()`` again brings it back on the same port, empty). Every client points at it through
``AWS_ENDPOINT_URL_S3``, which botocore reads, with dummy credentials.
"""

import os
import socket
import subprocess
import sys
import time

__all__ = ["S3Server", "free_port"]

# The credentials every test uses; a test checks that they are never printed or recorded.
ACCESS_KEY = "AKIATESTKEY00000001"
SECRET_KEY = "test-secret-Zq8wV3nR7tY2uK5pL0sD"
SESSION_TOKEN = "test-session-token-Hx4cM9bN1vF6gJ2k"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class S3Server:
    def __init__(self, port: int = 0):
        self.port = port or free_port()
        self.process = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        """The variables a client of this endpoint needs."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_SESSION_TOKEN": SESSION_TOKEN,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self) -> "S3Server":
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError("moto's server exited at start") from None
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto's server did not answer on port {self.port} within 60 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def apply(server: S3Server, environ=os.environ) -> None:
    environ.update(server.env())
