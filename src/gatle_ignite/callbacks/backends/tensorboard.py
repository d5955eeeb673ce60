"""TensorBoard event files under ``<save_dir>/tensorboard/``.

Besides the scalars: the learning rates under their param groups' names (``lr/decay``), the
run's hyper-parameters for the HPARAMS view (the config's fields that change what it trains,
secrets redacted, linked to its score and metrics), and the model's graph, traced once from the
first training batch.
"""

import json
import numbers
import os
import time
import warnings

from gatle_ignite.callbacks.logging import Backend as BaseBackend
from gatle_ignite.callbacks.logging import import_extra
from gatle_ignite.redaction import config_payload
from gatle_ignite.run.identity import bookkeeping, flatten
from gatle_ignite.run.storage import local_dir
from gatle_ignite.specs import EVAL_SPECS

__all__ = ["GRAPH_MAX_PARAMETERS", "Backend", "hparams_of"]

# Above this the graph is not drawn: tracing runs the model a few times on the first batch
# (torch checks its trace), 2.7 s for 4.7 M parameters on one CPU thread, more beyond it.
GRAPH_MAX_PARAMETERS = 100_000_000
_EVENT_FILE = "events.out.tfevents."


def _newest_event_file_second(log_dir) -> int:
    """The creation second in the newest event file name there (0 for none): a name starts
    with it, ten digits wide, and TensorBoard reads a directory's files in name order."""
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return 0
    seconds = [name[len(_EVENT_FILE) :].split(".")[0] for name in names]
    return max((int(second) for second in seconds if second.isdigit()), default=0)


def hparams_of(cfg) -> dict:
    """The config's fields that can change what the run trains, flat and redacted, as the
    HPARAMS view takes them: numbers, booleans and strings as they are, the rest as JSON."""
    hparams = {}
    for name, value in flatten(config_payload(cfg)).items():
        if bookkeeping(name) or value is None:
            continue
        keeps = isinstance(value, (numbers.Real, str))
        hparams[name] = value if keeps else json.dumps(value, sort_keys=True)
    return hparams


def _metric_tags(cfg) -> list:
    """The metrics the HPARAMS view sets beside the hyper-parameters: every score, then every
    evaluation metric the config names, then the training loss."""
    tags = []
    for spec in EVAL_SPECS:
        score = cfg.get(spec.score_field, None)
        metrics = cfg.get(spec.metrics_field, None) or {}
        named = [f"{spec.engine_type}/{key}" for key in getattr(metrics, "keys", list)()]
        tags += [tag for tag in [score, *named] if tag and tag not in tags]
    return tags + ["train/loss_avg"]


class Backend(BaseBackend):
    """One scalar per metric: iteration-level ones at their step, epoch-level ones at the epoch."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.summary = import_extra("torch.utils.tensorboard", "tensorboard")
        self.log_dir = os.path.join(local_dir(cfg.save_dir), "tensorboard")
        # Before this process's own file: a rewind's file must sort after the earlier runs'.
        self._earlier_runs_second = _newest_event_file_second(self.log_dir)
        self.writer = self.summary.SummaryWriter(log_dir=self.log_dir)
        self._tags = {}
        self._hparams_written = False

    def _write_hparams(self, step):
        """At the first step this process logs: a resume's rewind has been made by then, and
        an event at an earlier step would make TensorBoard drop what follows it."""
        from torch.utils.tensorboard.summary import hparams

        metrics = dict.fromkeys(_metric_tags(self.cfg), 0.0)
        experiment, session_start, _session_end = hparams(hparams_of(self.cfg), metrics)
        self.writer.file_writer.add_summary(experiment, global_step=step)
        self.writer.file_writer.add_summary(session_start, global_step=step)
        self._hparams_written = True

    def name_lr_groups(self, names):
        self._tags = {f"train/lr_{i}": f"lr/{name}" for i, name in enumerate(names)}

    def log(self, metrics, step=None, epoch=None):
        at = step if step is not None else epoch
        if not self._hparams_written:
            self._write_hparams(at)
        for name, value in metrics.items():
            # A scalar plot cannot hold a list-valued metric (a confusion matrix, ...).
            if isinstance(value, numbers.Real):
                self.writer.add_scalar(self._tags.get(name, name), value, global_step=at)
        # So a crash or a kill loses nothing already logged.
        self.writer.flush()

    def graph(self, model, inputs):
        size = sum(p.numel() for p in model.parameters())
        if size > GRAPH_MAX_PARAMETERS:
            warnings.warn(
                f"tensorboard: the model's graph is not drawn: {size:,} parameters are more "
                f"than the {GRAPH_MAX_PARAMETERS:,} it is drawn for (tracing runs the model "
                f"a few times).",
                stacklevel=2,
            )
            return
        try:
            with warnings.catch_warnings():
                # torch.jit.trace's deprecation and tracer warnings say nothing to the user.
                warnings.simplefilter("ignore")
                self.writer.add_graph(model, inputs, use_strict_trace=False)
        except Exception as error:
            lines = str(error).strip().splitlines()
            warnings.warn(
                f"tensorboard: the model's graph is not drawn: tracing it failed with "
                f"{type(error).__name__}: {lines[0] if lines else ''}\n"
                f"  Training is unaffected.",
                stacklevel=2,
            )
        self.writer.flush()

    def rewind(self, step):
        # TensorBoard hides the events from purge_step on, in the files it reads before this
        # one: by name, whose first field is the second the file was made. A resume within
        # the second the run's last file was made (a short run, a quick requeue) waits it out.
        self.writer.close()
        while int(time.time()) <= self._earlier_runs_second:
            time.sleep(0.05)
        self.writer = self.summary.SummaryWriter(log_dir=self.log_dir, purge_step=step + 1)

    def finish(self, failed=False):
        self.writer.close()
