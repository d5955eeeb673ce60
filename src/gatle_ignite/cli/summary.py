"""The lines that end ``gatle-ignite train``: what the run became, where it is, what to run next.

Read from the run's manifest, so they are the same whether the run trained in this process or
in ranks it spawned.
"""

import os
import re
import shlex
import time
from typing import Optional

from gatle_ignite.cli.time_breakdown import time_breakdown_rows
from gatle_ignite.redaction import redact_argv
from gatle_ignite.run.filesystem import UnsafeFile, read_confined
from gatle_ignite.run.layout import MANIFEST_FILE, OWNED_LOGS
from gatle_ignite.run.manifest import Manifest
from gatle_ignite.run.scores import direction, metric_value
from gatle_ignite.run.storage import local_dir, shown_in
from gatle_ignite.trainer.lifecycle import EXIT_DIVERGED

__all__ = ["end_of_run", "last_recorded"]

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
# The states of a finished run, and what the end line adds to TRAINING COMPLETE for each.
_FINISHED = {"completed": "", "early-stopped": "stopped early", "pruned": "pruned by its sweep"}
# What to change in a diverged run before training it again.
_WHAT_DIVERGES = "a lower learning rate, or the loss or the data"
_TRAINING_ONLY_PATTERN = re.compile(r"every_\w+|\w+_early_stop_(patience|after)")
# Characters a shell still reads inside double quotes (and bash's history expansion).
_SPECIAL_IN_DOUBLE_QUOTES = set('"\\$`!')


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


def _best_line(manifest: Manifest, cfg, save_dir):
    score_name = cfg.get("score_name", None)
    engine = score_name.split("/")[0] if score_name else ""
    bests = [e for e in manifest.checkpoints if e.kind == "best" and e.engine == engine]
    if not bests:
        return None
    top = max(bests, key=lambda e: (e.score if e.score is not None else float("-inf"), e.epoch))
    factor = cfg.get("score_factor", 1) or 1
    value = metric_value(top.score, factor)
    shown = f"{value:.5g}{direction(factor)}" if value is not None else "?"
    return f"{score_name} {shown} at epoch {top.epoch}: {shown_in(save_dir, top.file)}"


def _latest(manifest: Manifest, save_dir):
    resumable = manifest.resumable_newest_first()
    return shown_in(save_dir, resumable[0].file) if resumable else None


def _logs(save_dir) -> str:
    here = local_dir(save_dir)
    found = [name for name in OWNED_LOGS if (here / name).exists()]
    return ", ".join(shown_in(save_dir, name) for name in [*found, MANIFEST_FILE])


def last_recorded(save_dir) -> Optional[bytes]:
    """The run in ``save_dir`` as ``run.json`` records it now, to tell whether a command
    recorded it; None without one."""
    try:
        return read_confined(local_dir(save_dir) / MANIFEST_FILE)
    except (OSError, UnsafeFile):
        return None


def _end_line(manifest: Manifest, seconds: float) -> str:
    """The summary's first line: 0.4's ``TRAINING COMPLETE after <E> epochs`` for a run that
    finished (``TRAINING DIVERGED`` for one that did not), how and where it ended."""
    state = manifest.state
    if state in _FINISHED:
        epochs = manifest.trained_epoch
        head = f"TRAINING COMPLETE after {epochs} epoch{'' if epochs == 1 else 's'}"
        head += f", {_FINISHED[state]}" if _FINISHED[state] else ""
    else:
        head = f"TRAINING {state.upper()}"
    head += f" ({manifest.stop_reason})" if manifest.stop_reason else ""
    return (
        f"{head}: '{manifest.name}', epoch {manifest.trained_epoch}/{manifest.max_epochs} "
        f"(iteration {manifest.trained_iteration}), {seconds:.1f} s in this command"
    )


def _evaluate(manifest: Manifest, config: str, overrides, latest) -> Optional[str]:
    """The eval command for the checkpoint it would load: the best file, else the latest."""
    if any(e.kind == "best" and e.engine == "valid" for e in manifest.checkpoints):
        return _command("eval", config, overrides, "--ckpt", "best")
    return _command("eval", config, overrides, "--ckpt", "latest") if latest else None


def _resume(manifest: Manifest, config: str, overrides, latest) -> list:
    """The resume rows: the command, and for a diverged run first what it would repeat."""
    command = _command("train", config, overrides, "--override", "resume=True")
    if manifest.state != "diverged":
        return [("resume", command)] if latest else []
    if latest is None:
        return [
            (
                "resume",
                f"nothing to resume: it diverged before its first checkpoint. Change what "
                f"diverged ({_WHAT_DIVERGES}) and train it again.",
            )
        ]
    return [
        (
            "resume",
            f"as it stands, resuming repeats the setting that diverged. Change it first "
            f"({_WHAT_DIVERGES}), naming a changed field in "
            f"--override \"accept_changes=['optimizer_params.lr']\":",
        ),
        ("", command),
    ]


def end_of_run(cfg, config: str, overrides, seconds: float) -> int:
    """Print the summary of the run in ``cfg.save_dir`` after this command trained it, and
    return the command's exit code: ``EXIT_DIVERGED`` for a diverged run, as ``status`` says."""
    save_dir = cfg.save_dir
    try:
        manifest = Manifest.read(local_dir(save_dir))
    except (ValueError, TypeError):
        manifest = None
    if manifest is None:
        return 0
    code = EXIT_DIVERGED if manifest.state == "diverged" else 0
    if not _first_process():
        return code
    lines = [_end_line(manifest, seconds)]
    # Where that time went, from the perf/ rows this command logged.
    spent = time_breakdown_rows(cfg, local_dir(save_dir), time.time() - seconds, seconds)
    lines += [f"  {label:<9}{value}" for label, value in spent]
    latest = _latest(manifest, save_dir)
    rows = [
        ("best", _best_line(manifest, cfg, save_dir)),
        ("latest", latest),
        ("logs", _logs(save_dir)),
        ("evaluate", _evaluate(manifest, config, overrides, latest)),
        *_resume(manifest, config, overrides, latest),
    ]
    lines += [f"  {label:<9}{value}" for label, value in rows if value]
    print("\n".join(lines))
    return code
