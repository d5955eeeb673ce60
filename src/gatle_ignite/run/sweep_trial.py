"""Which sweep trial a run is, as the sweep that started it says through the environment.

A trial's config is the config plus its parameters as overrides, exactly what a person would
type; that it belongs to a sweep is not part of the config (its fingerprint equals the hand-run's)
but a fact about the process, recorded in ``run.json``.
"""

import json
import os
from typing import Optional

__all__ = ["TRIAL_VAR", "trial_of_this_process", "trial_record"]

# Set by a sweep's worker on every trial it starts: a JSON object (see sweep.worker).
TRIAL_VAR = "GATLE_IGNITE_SWEEP_TRIAL"


def trial_of_this_process() -> Optional[dict]:
    """What the sweep told this process about its trial, or None outside a sweep."""
    text = os.environ.get(TRIAL_VAR)
    if not text:
        return None
    try:
        trial = json.loads(text)
    except ValueError:
        return None
    return trial if isinstance(trial, dict) else None


def trial_record() -> Optional[dict]:
    """The part a run records in ``run.json``: the sweep, the trial number, the parameters.

    The storage is left out: its URL may hold a password, and the sweep directory names it.
    """
    trial = trial_of_this_process()
    if trial is None:
        return None
    return {key: trial.get(key) for key in ("sweep_dir", "study", "trial", "params")}
