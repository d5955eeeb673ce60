"""Host reads per training iteration: how often the loop makes the host wait for the device.

    python -m bench.reads

A read is a call of ``Tensor.item``, ``tolist``, ``__bool__``, ``__float__`` or ``cpu`` whose
caller is outside ``torch.optim`` and ``torch.utils.data`` (what tests/test_loop_checks.py
counts); on a GPU each one waits for every queued kernel. ``gatle-ignite train`` runs the bench
config, every extra off, for 5 epochs of 32 iterations, and the bench Trainer counts the reads
of epochs 2..5: inside iterations (the step and the iteration's handlers) and between them
(epoch starts and ends). Counts do not vary between runs, so one repetition is enough.
"""

import os

from bench import common

EPOCHS = 5
VARIANTS = {
    "default": "check_every unset (1 for one CPU process)",
    "k1": "check_every=1",
    "k8": "check_every=8",
    "k32": "check_every=32",
    "k16_logged": "check_every=16, metrics.csv points every iteration (log_every unset)",
}
# Reads inside an iteration, at most: one per check. The default is 1 for one CPU process.
TARGETS = {"default": 1.0, "k1": 1.0, "k8": 1 / 8, "k32": 1 / 32, "k16_logged": 1 / 16}
# Reads per iteration in all (epoch ends included) where a logged point falls on every one.
LOGGED_LIMIT = 0.2


def count(overrides, config=common.CONFIG, syncs=False):
    """Train in this process with the bench Trainer counting reads (or CUDA syncs)."""
    os.environ[common.COUNT_ENV] = "syncs" if syncs else "reads"
    return common.run_gatle(overrides, config)["reads"]


def child(variant, _args):
    name = variant.partition("@")[0]
    if name == "k16_logged":
        # The bench task's 32-iteration epoch makes log_every 1: a point at every iteration.
        logged = ["check_every=16", "logger_name=['csv']", "every_val=0", "save_ckpt=False"]
        return count([*logged, "score_name=None", "max_epochs=10"])
    every = [] if name == "default" else [f"check_every={name[1:]}"]
    return count([*common.EXTRAS_OFF, f"max_epochs={EPOCHS}", *every])


def rows_and_checks(results, labels, targets, prefix):
    """One row and one check per variant, from :func:`count`'s results."""
    rows, checks = [], []
    for name, reads in results.items():
        inside = reads["iteration"] / reads["iterations"]
        between = reads["between"] / reads["epochs"]
        overall = (reads["iteration"] + reads["between"]) / reads["iterations"]
        where = "; ".join(f"{source} x{n}" for source, n in reads["sources"])
        rows.append([common.label(labels, name), f"{inside:.3f}", f"{between:.1f}"])
        rows[-1] += [f"{overall:.3f}", where]
        note = f"{between:.1f} per epoch between iterations; {overall:.3f} per iteration in all"
        check = f"{prefix}: {common.label(labels, name)}, inside an iteration"
        checks.append(common.Check(check, inside, targets.get(name), unit="", note=note))
    headers = ["variant", "per iteration", "per epoch, between", "per iteration, all", "where"]
    return common.table(headers, rows), checks


def run(reps=None):
    """Measure, print the table, return the checks (bench.run_all calls this)."""
    print("== host reads per training iteration ==")
    names = common.with_baseline(VARIANTS, ("default", "k16_logged"))
    results = common.interleaved("bench.reads", names, reps or 1)
    text, checks = rows_and_checks(
        {name: values[0] for name, values in results.items()}, VARIANTS, TARGETS, "reads"
    )
    print(text)
    for name, values in results.items():
        if name.partition("@")[0] == "k16_logged":
            reads = values[0]
            overall = (reads["iteration"] + reads["between"]) / reads["iterations"]
            limit = None if "@" in name else LOGGED_LIMIT
            label = f"reads: {common.label(VARIANTS, name)}, per iteration in all"
            checks.append(common.Check(label, overall, limit, unit=""))
    return text, checks


if __name__ == "__main__":
    common.main(__doc__, run, child)
