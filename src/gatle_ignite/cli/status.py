"""``gatle-ignite status SAVE_DIR``: what a run directory holds, and an exit code to act on.

The exit code is for job scripts: 0 the run is finished (completed, stopped early or pruned),
75 it can be continued with ``resume=True`` (preempted, killed without a word, or its
``run.json`` damaged, which a resume rebuilds), 1 it failed, 65 it diverged (the code
``gatle-ignite train`` exited with: resumed as it is, it diverges again), 3 a live process is
training it now.
"""

from typing import Optional

from gatle_ignite.cli.lr_find import PLOT_FILE as LR_FIND_PLOT
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.redaction import shown_command
from gatle_ignite.run.directory import indexed_view, recorded_config, unindexed_files
from gatle_ignite.run.layout import MANIFEST_FILE
from gatle_ignite.run.manifest import Manifest
from gatle_ignite.run.scores import LOWER_IS_BETTER, metric_value, scoring
from gatle_ignite.run.storage import Place, holder_of, place_of
from gatle_ignite.trainer.lifecycle import EXIT_DIVERGED
from gatle_ignite.trainer.preemption import EXIT_PREEMPTED
from gatle_ignite.utils.escapes import escaped

__all__ = ["run_status"]

EXIT_FINISHED, EXIT_FAILED, EXIT_RUNNING = 0, 1, 3
_EXIT_CODES = {
    "completed": EXIT_FINISHED,
    "early-stopped": EXIT_FINISHED,
    "pruned": EXIT_FINISHED,
    "preempted": EXIT_PREEMPTED,
    "interrupted": EXIT_PREEMPTED,
    "failed": EXIT_FAILED,
    "diverged": EXIT_DIVERGED,
    "running": EXIT_RUNNING,
}


def _read(place: Place) -> tuple:
    """``(manifest, "")``, or ``(None, why)`` when ``run.json`` is damaged."""
    held = place.names()
    if held is None:
        raise ConfigError(f"{place.shown()} does not exist.\n  Give the save_dir of a run.")
    place.pull_records()
    try:
        manifest = Manifest.read(place.path)
    except ValueError as error:
        return None, str(error)
    if manifest is None:
        raise ConfigError(_no_run(place, held))
    return manifest, ""


def _no_run(place: Place, held: list) -> str:
    """Why the directory (no ``run.json``) is no run, by what it holds."""
    save_dir = place.shown()
    if indexed_view(place, None):
        return (
            f"{save_dir} holds checkpoints but no run.json: a run of gatle-ignite 0.4, which "
            f"gets one at its next resume.\n"
            f"  Resume it (--override resume=True), or give the save_dir of another run."
        )
    held = sorted(held)
    if held == [LR_FIND_PLOT]:
        what = f"only {LR_FIND_PLOT}, the plot `gatle-ignite lr-find` writes, which trains no run"
    elif held:
        what = f"no run.json and no checkpoint, only {', '.join(held[:5])}"
        what += f" and {len(held) - 5} more" if len(held) > 5 else ""
    else:
        what = "nothing: it is empty"
    return (
        f"{save_dir} holds no gatle-ignite run: {what}.\n"
        f"  Give the save_dir of a run that `gatle-ignite train` started."
    )


def _progress(manifest) -> str:
    """How far the run trained, in whole epochs and the part of the next one."""
    iteration, length = manifest.trained_iteration, manifest.epoch_length
    if not length:
        return f"iteration {iteration} (epoch {manifest.trained_epoch})"
    epochs, part = divmod(iteration, length)
    if not part:
        return f"{epochs} epoch(s), iteration {iteration}"
    return f"{epochs} epoch(s) and {part}/{length} iterations of epoch {epochs + 1}"


def _checkpoint_line(entry, config: dict) -> str:
    where = f"epoch {entry.epoch}, iteration {entry.iteration}"
    return f"  {entry.file}  ({where}{_score(entry, config)})"


def _score(entry, config: dict) -> str:
    """The metric's own value a best file was kept for, and which way is better."""
    if entry.score is None:
        return ""
    name, factor = scoring(config, entry.engine)
    shown = f", {name or 'score'} {metric_value(entry.score, factor):.5g}"
    return f"{shown}, {LOWER_IS_BETTER}" if factor < 0 else shown


def _trial_line(trial: dict) -> str:
    params = ", ".join(f"{key}={value!r}" for key, value in (trial.get("params") or {}).items())
    return f"trial {trial.get('trial')} of {trial.get('sweep_dir')} ({params})"


def _say(line: str) -> None:
    """Print a line of values read from the run directory, their control characters escaped:
    a run.json written by anyone cannot clear the screen or forge a line of its own."""
    print(escaped(line))


def run_status(save_dir) -> int:
    """Print the run in ``save_dir`` (a directory or a URL) and return the exit code its state
    calls for."""
    place = place_of(save_dir)
    save_dir = place.shown()
    manifest, damage = _read(place)
    live = holder_of(place)
    if manifest is None:
        return _damaged(place, damage, live)
    state = manifest.state
    if state == "running" and live is None:
        state = "interrupted"
    reason = f" ({manifest.stop_reason})" if manifest.stop_reason else ""
    _say(f"run:      {manifest.name} (id {manifest.run_id}) in {save_dir}")
    _say(f"state:    {state}{reason}")
    _print_holder(live)
    if manifest.sweep:
        _say(f"sweep:    {_trial_line(manifest.sweep)}")
        if _EXIT_CODES.get(state) == EXIT_PREEMPTED:
            # The study, not this exit code, decides whether the trial goes on.
            _say("          requeue its sweep, which resumes it; not this run on its own")
    _say(f"trained:  {_progress(manifest)}")
    _say(f"config:   {manifest.config_fingerprint}, last written {manifest.updated}")
    _print_checkpoints(manifest.checkpoints, manifest.config)
    _print_unindexed(unindexed_files(place, manifest))
    return _EXIT_CODES.get(state, EXIT_FAILED)


def _print_holder(live: Optional[dict]) -> None:
    if live is None:
        return
    command = shown_command(str(live.get("command")))
    _say(f"held by:  pid {live.get('pid')} on {live.get('host')}: {command}")
    if live.get("unverified"):
        _say("          (another host, and this file system cannot tell whether it still runs)")


def _print_checkpoints(entries: list, config: dict) -> None:
    _say("checkpoints:")
    for entry in sorted(entries, key=lambda e: (e.kind, e.progress_key())):
        _say(_checkpoint_line(entry, config))


def _print_unindexed(names: list) -> None:
    """The checkpoint files run.json does not index: named, never counted as the run's."""
    if not names:
        return
    _say(
        f"not indexed: {len(names)} file(s) the run did not record in {MANIFEST_FILE}, never "
        f"ranked; a resume adopts one only if it holds this run's state (written, then cut off "
        f"by a kill before it was indexed):"
    )
    for name in names:
        _say(f"  {name}")


def _damaged(place: Place, why: str, live: Optional[dict]) -> int:
    """A run whose ``run.json`` cannot be read: what its files say, as a resume would see it."""
    save_dir, manifest = place.shown(), place.shown(MANIFEST_FILE)
    if (place.path / MANIFEST_FILE).is_dir():
        # As a resume refuses it: a requeue loop on this exit code must not go round forever.
        raise ConfigError(
            f"{manifest} is a directory, where the run keeps its manifest.\n"
            f"  Move that directory out of {save_dir}; a resume then rebuilds the manifest."
        )
    entries = indexed_view(place, None)
    if live is None and not entries:
        raise ConfigError(
            f"{manifest} is damaged ({why}), and {save_dir} holds no checkpoint.\n"
            f"  Start the run again (a fresh run writes a new one), or give another save_dir."
        )
    _say(f"run:      unknown, in {save_dir}")
    _say(f"state:    unknown: {manifest} is damaged ({why})")
    _print_holder(live)
    _say("          a resume rebuilds it from the checkpoints below")
    _print_checkpoints(entries, recorded_config(place.path) or {})
    return EXIT_RUNNING if live is not None else EXIT_PREEMPTED
