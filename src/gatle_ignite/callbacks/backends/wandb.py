"""A Weights & Biases run per config; the API key comes from ``WANDB_API_KEY`` only."""

import contextlib
import sys

from gatle_ignite.callbacks.logging import Backend as BaseBackend
from gatle_ignite.callbacks.logging import import_extra
from gatle_ignite.callbacks.run_record import config_payload, redact_text
from gatle_ignite.redaction import redact_argv

__all__ = ["Backend"]


class Backend(BaseBackend):
    """Logs to the W&B run whose id is ``cfg.name``, so rerunning a config resumes it."""

    def __init__(self, cfg):
        super().__init__(cfg)
        wandb = import_extra("wandb", "wandb")
        with _argv_redacted():
            self.run = wandb.init(
                project=cfg.project_name,
                entity=cfg.get("wandb_entity", None),
                id=cfg.name,
                name=cfg.name,
                config=config_payload(cfg),
                tags=[redact_text(tag) for tag in cfg.tags],
                resume="allow",
                save_code=False,
                allow_val_change=True,
                settings=wandb.Settings(init_timeout=600),
            )

    def log(self, metrics, step=None, epoch=None):
        payload = dict(metrics)
        if epoch is not None:
            payload["epoch"] = epoch
        # The global iteration, the step every backend shares.
        self.run.log(payload, step=step)

    def watch(self, model):
        self.run.watch(model)

    def finish(self, failed=False):
        self.run.finish(exit_code=1 if failed else 0)


@contextlib.contextmanager
def _argv_redacted():
    """wandb records the command line (``sys.argv``) as the run starts: it gets it redacted."""
    argv = sys.argv
    sys.argv = redact_argv(argv)
    try:
        yield
    finally:
        sys.argv = argv
