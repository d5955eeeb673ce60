"""Template for a ``logger_name`` entry: ``Backend(cfg)`` with ``log``, ``watch`` and ``finish``."""

import csv
from pathlib import Path

from gatle_ignite.callbacks.logging import Backend as BaseBackend


class Backend(BaseBackend):
    """Appends one CSV row per ``log`` call to ``<save_dir>/<name>_metrics.csv``.

    The first row fixes the header (``step``, ``epoch``, then its metric keys); keys that appear
    only later are dropped. A file left by an earlier run (a resume) keeps its header and grows.
    ``watch`` and ``finish`` are the inherited no-ops.
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        self.path = Path(cfg.save_dir) / f"{cfg.name}_metrics.csv"
        self.fields = None

    def _existing_header(self):
        if not self.path.is_file():
            return None
        with self.path.open(newline="") as handle:
            return next(csv.reader(handle), None)

    def log(self, metrics, step=None, epoch=None):
        row = {"step": step, "epoch": epoch, **metrics}
        new_file = False
        if self.fields is None:
            self.fields = self._existing_header()
            new_file = self.fields is None
            if new_file:
                self.fields = list(row)
                self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.fields, extrasaction="ignore")
            if new_file:
                writer.writeheader()
            writer.writerow(row)
