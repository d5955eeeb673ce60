"""The lines that end ``gatle-ignite train``: what the run became, where it is, what to run next.

Read from the run's manifest, so they are the same whether the run trained in this process or
in ranks it spawned.
"""

import contextlib
import os
import re
import shlex
import time
from pathlib import Path
from typing import Optional

from gatle_ignite.callbacks.logging import SUMMARY_FOLLOWS_VAR
from gatle_ignite.cli.time_breakdown import time_breakdown_rows
from gatle_ignite.redaction import redact_argv
from gatle_ignite.run.layout import MANIFEST_FILE, OWNED_LOGS
from gatle_ignite.run.manifest import Manifest
from gatle_ignite.run.scores import direction, metric_value

__all__ = ["print_run_summary", "summary_follows"]

# Overrides that steer one start and would mislead in a suggested command.
_ONE_OFF = ("resume", "replace_run", "accept_changes", "profile")
# Fields only training reads: `eval` runs every engine once on a checkpoint, so an evaluate
# command that repeated them would only be longer.
_TRAINING_ONLY = (
    "max_epochs",
    "train_length",
    "early_stop_patience",
    "early_stop_after",
    "optimizer_params",
    "lr_scheduler",
    "lr_scheduler_params",
    "grad_clip_norm",
    "grad_clip_value",
    "accum_steps",
    "check_every",
    "save_ckpt",
    "n_saved",
    "save_every_iters",
    "async_save",
    "model_checkpoint_dir",
    "log_every",
    "watch_grad",
)
_TRAINING_ONLY_PATTERN = re.compile(r"every_\w+|\w+_early_stop_(patience|after)")
# Characters a shell still reads inside double quotes (and bash's history expansion).
_SPECIAL_IN_DOUBLE_QUOTES = set('"\\$`!')


@contextlib.contextmanager
def summary_follows():
    """Around a training run this command sums up: the trainer leaves its end line out."""
    previous = os.environ.get(SUMMARY_FOLLOWS_VAR)
    os.environ[SUMMARY_FOLLOWS_VAR] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(SUMMARY_FOLLOWS_VAR, None)
        else:
            os.environ[SUMMARY_FOLLOWS_VAR] = previous


def _first_process() -> bool:
    """Under torchrun or srun every rank runs the CLI; only the first one reports."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


def _field(override: str) -> str:
    """The top-level field an override sets: ``optimizer_params`` for ``optimizer_params.lr=1``."""
    return override.split("=", 1)[0].strip().split(".", 1)[0]


def _training_only(override: str) -> bool:
    field = _field(override)
    return field in _TRAINING_ONLY or bool(_TRAINING_ONLY_PATTERN.fullmatch(field))


def _quoted(word: str) -> str:
    """The word as a shell reads it back: bare when it can be, else in the quotes a person
    would write (``"logger_name=['text', 'csv']"``), else as shlex quotes it."""
    quoted = shlex.quote(word)
    if quoted == word or "'" not in word:
        return quoted
    if not _SPECIAL_IN_DOUBLE_QUOTES & set(word):
        return f'"{word}"'
    return quoted


def _command(verb: str, config: str, overrides, *extra) -> str:
    """A command to copy: ``--config=PATH``, then ``--override KEY=VALUE`` words, redacted."""
    kept = [o for o in overrides if _field(o) not in _ONE_OFF]
    if verb == "eval":
        kept = [o for o in kept if not _training_only(o)]
    words = [f"--config={config}"]
    for override in kept:
        words += ["--override", override]
    words = redact_argv([*words, *extra])
    return " ".join(["gatle-ignite", verb, *map(_quoted, words)])


def _best_line(manifest: Manifest, cfg, save_dir: Path):
    score_name = cfg.get("score_name", None)
    engine = score_name.split("/")[0] if score_name else ""
    bests = [e for e in manifest.checkpoints if e.kind == "best" and e.engine == engine]
    if not bests:
        return None
    top = max(bests, key=lambda e: (e.score if e.score is not None else float("-inf"), e.epoch))
    factor = cfg.get("score_factor", 1) or 1
    value = metric_value(top.score, factor)
    shown = f"{value:.5g}{direction(factor)}" if value is not None else "?"
    return f"{score_name} {shown} at epoch {top.epoch}: {save_dir / top.file}"


def _latest(manifest: Manifest, save_dir: Path):
    resumable = manifest.resumable_newest_first()
    return str(save_dir / resumable[0].file) if resumable else None


def _logs(save_dir: Path) -> str:
    found = [save_dir / name for name in OWNED_LOGS if (save_dir / name).exists()]
    return ", ".join(str(p) for p in [*found, save_dir / "run.json"])


def last_recorded(save_dir) -> Optional[bytes]:
    """The run in ``save_dir`` as ``run.json`` records it now, to tell whether a command
    recorded it; None without one."""
    try:
        return (Path(save_dir) / MANIFEST_FILE).read_bytes()
    except OSError:
        return None


def print_run_summary(cfg, config: str, overrides, seconds: float) -> None:
    """Print the summary of the run in ``cfg.save_dir`` after this command trained it."""
    save_dir = Path(cfg.save_dir)
    try:
        manifest = Manifest.read(save_dir)
    except (ValueError, TypeError):
        manifest = None
    if manifest is None or not _first_process():
        return
    reason = f" ({manifest.stop_reason})" if manifest.stop_reason else ""
    lines = [
        f"RUN {manifest.state.upper()}{reason}: '{manifest.name}', epoch "
        f"{manifest.trained_epoch}/{manifest.max_epochs} (iteration "
        f"{manifest.trained_iteration}), {seconds:.1f} s in this command",
    ]
    # Where that time went, from the perf/ rows this command logged.
    spent = time_breakdown_rows(cfg, save_dir, time.time() - seconds, seconds)
    lines += [f"  {label:<9}{value}" for label, value in spent]
    rows = (
        ("best", _best_line(manifest, cfg, save_dir)),
        ("latest", _latest(manifest, save_dir)),
        ("logs", _logs(save_dir)),
        ("evaluate", _command("eval", config, overrides, "--ckpt", "best")),
        ("resume", _command("train", config, overrides, "--override", "resume=True")),
    )
    lines += [f"  {label:<9}{value}" for label, value in rows if value]
    print("\n".join(lines))
