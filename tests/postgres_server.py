"""A PostgreSQL server of the tests' own: ``initdb`` and ``pg_ctl`` on a Unix socket in a temp dir.

It listens on no TCP port, only on a socket in its own directory, and is stopped and deleted
after. PostgreSQL refuses to run as root, so under root it runs as the ``postgres`` user
(``runuser``), in directories that user owns.

``python tests/postgres_server.py`` starts one, creates a database, connects to it through
psycopg, stops it, and exits 0; otherwise it says why and exits 1 (``.ci/run`` runs it before the
tests, so that CI fails loudly rather than skipping the PostgreSQL tests).
"""

import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

__all__ = ["PostgresServer", "find_bindir"]

_SYSTEM_USER = "postgres"


def find_bindir() -> Optional[Path]:
    """The directory of ``initdb`` and ``pg_ctl``: PG_BINDIR, the newest packaged version, or
    the PATH."""
    given = os.environ.get("PG_BINDIR")
    candidates = [given] if given else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    which = shutil.which("initdb")
    if which:
        candidates.append(str(Path(which).resolve().parent))
    for candidate in candidates:
        if (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    return None


class PostgresServer:
    """One server: ``start()``, ``url(database)``, ``stop()``; ``stop_server()`` and
    ``start_server()`` in between restart it on the same data, as an administrator would."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="gatle-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "socket"
        self.user = _SYSTEM_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, *command: str) -> subprocess.CompletedProcess:
        argv = [str(self.bindir / command[0]), *command[1:]]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", _SYSTEM_USER, "--", *argv]
        # No timeout of its own: on a loaded machine initdb alone can take minutes, and a hang
        # is caught by pytest-timeout (or CI's own limit for the check below).
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")
        return done

    def start(self) -> "PostgresServer":
        self.socket_dir.mkdir(parents=True)
        if os.geteuid() == 0:
            entry = pwd.getpwnam(_SYSTEM_USER)
            for path in (self.root, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8")
        self.start_server()
        return self

    def start_server(self) -> None:
        """Start the server on its data, and wait until it accepts connections."""
        options = f"-c listen_addresses='' -c unix_socket_directories='{self.socket_dir}'"
        log = self.root / "server.log"
        wait = ["-w", "-t", "86400"]  # pg_ctl's own 60 s wait is too short on a loaded machine
        self._run("pg_ctl", "-D", str(self.data), "-l", str(log), "-o", options, *wait, "start")

    def stop_server(self) -> None:
        """Stop the server as a restart does ("fast": open sessions are ended), keeping its
        data; returns once it is down."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "86400", "stop")

    def create_database(self, name: str) -> str:
        self._run("createdb", "-h", str(self.socket_dir), "-U", self.user, name)
        return self.url(name)

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@/{database}?host={self.socket_dir}"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def main() -> int:
    bindir = find_bindir()
    if bindir is None:
        print("no PostgreSQL server binaries (initdb, pg_ctl) found; set PG_BINDIR")
        return 1
    server = PostgresServer(bindir)
    try:
        url = server.start().create_database("gatle_check")
        import psycopg

        with psycopg.connect(url) as connection:
            version = connection.execute("select version()").fetchone()[0]
        print(f"PostgreSQL starts and answers: {version.split(',')[0]}")
        return 0
    except Exception as error:
        print(f"PostgreSQL cannot start here: {error}")
        return 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
