"""Run started / results / run complete or failed, posted to a Discord webhook."""

import os
from urllib.parse import urlsplit

from gatle_ignite.callbacks.logging import Backend as BaseBackend
from gatle_ignite.callbacks.logging import import_extra
from gatle_ignite.callbacks.perf_line import is_perf_record
from gatle_ignite.callbacks.run_record import REDACTED, redact_text
from gatle_ignite.dispatch import ConfigError

__all__ = ["Backend", "check_config"]

# Discord rejects an embed with more fields than this.
MAX_FIELDS = 25


def _field_value(value) -> str:
    return format(value, ".5g") if isinstance(value, float) else str(value)


def _webhook_url(cfg) -> str:
    url = cfg.get("discord_url") or os.environ.get("DISCORD_WEBHOOK_URL", "")
    if not url:
        raise ConfigError(
            "logger_name names 'discord', but no webhook URL is set.\n"
            "  Set cfg.discord_url or the DISCORD_WEBHOOK_URL environment variable."
        )
    return url


def check_config(cfg) -> None:
    """What starting this backend would refuse, found before anything starts: no webhook."""
    _webhook_url(cfg)


class Backend(BaseBackend):
    """Posts embeds titled ``cfg.name``; a failed post is printed, never raised."""

    # One message per epoch; a point every log_every iterations would flood the channel.
    per_iteration = False

    def __init__(self, cfg):
        super().__init__(cfg)
        self.requests = import_extra("requests", "discord")
        self.url = _webhook_url(cfg)
        self.username = cfg.get("discord_username", "gatle")
        self._send("Run started", [])

    def _scrub(self, message: str) -> str:
        # requests quotes the URL (or its path, which holds the webhook token) in its errors,
        # and a proxy's URL, credentials included, in a ProxyError.
        parts = urlsplit(self.url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        for secret in (self.url, path):
            if len(secret) > 1:
                message = message.replace(secret, REDACTED)
        return redact_text(message)

    def _send(self, description: str, fields: list) -> None:
        payload = {
            "username": self.username,
            "embeds": [
                {"title": self.cfg.name, "description": description, "fields": fields[:MAX_FIELDS]}
            ],
        }
        try:
            response = self.requests.post(self.url, json=payload, timeout=10)
            response.raise_for_status()
        except Exception as err:
            print(f"[discord] failed to send: {self._scrub(str(err))}")

    def log(self, metrics, step=None, epoch=None):
        if is_perf_record(metrics):
            return  # a notification per epoch is enough; where the time went is in the logs
        header = f"Epoch {epoch}" if epoch is not None else f"Step {step}"
        fields = [
            {"name": name, "value": _field_value(metrics[name]), "inline": True}
            for name in sorted(metrics)
        ]
        self._send(f"Results for {header}", fields)

    def finish(self, failed=False):
        self._send("Run failed" if failed else "Run complete", [])
