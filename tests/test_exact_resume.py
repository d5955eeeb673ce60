"""Exact resume in one process: interrupted anywhere, the resumed run ends on the same weights."""

import random
import struct

import pytest
import torch
from ignite.engine import Events

from gatle_ignite.utils.checkpoints import find_resume_checkpoints
from tests.toy.trainer import Trainer


class Interrupt(Exception):
    pass


def _fields(num_workers=0):
    """Shuffling, dropout, a random augmentation (in workers when asked) and a schedule."""
    return {
        "max_epochs": 3,
        "save_every_iters": 1,
        "model_params": {"dropout": 0.3},
        "train_ds_name": "tests.toy.data_aug",
        "train_ds_params": {"n": 64, "bs": 16, "shuffle": True, "num_workers": num_workers},
        "lr_scheduler": "gatle_ignite.schedulers.warmup_cosine",
    }


def _cfg(make_cfg, save_dir, num_workers=0, **fields):
    return make_cfg(save_dir=str(save_dir), **_fields(num_workers), **fields)


def _weights(task):
    return {k: v.clone() for k, v in task.model.state_dict().items()}


def _interrupted_then_resumed(make_cfg, save_dir, at, **fields):
    task = Trainer(0, _cfg(make_cfg, save_dir, **fields)).setup()

    def interrupt(engine):
        if engine.state.iteration == at:
            raise Interrupt

    task.engines["trainer"].add_event_handler(Events.ITERATION_COMPLETED, interrupt)
    with pytest.raises(Interrupt):
        task.fit()
    return save_dir


def _resume(make_cfg, save_dir, **fields):
    task = Trainer(0, _cfg(make_cfg, save_dir, resume=True, **fields))
    task.fit()
    return _weights(task)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    from tests.toy.config import toy_config

    results = {}
    for workers in (0, 2):
        save_dir = tmp_path_factory.mktemp(f"reference{workers}")
        task = Trainer(0, toy_config(save_dir=str(save_dir), **_fields(workers)))
        task.fit()
        results[workers] = _weights(task)
    return results


def _equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("at", [1, 2, 3, 4, 5, 6, 8, 9, 11])
def test_interrupted_at_any_iteration_the_resumed_run_is_bit_identical(
    make_cfg, tmp_path, reference, at
):
    save_dir = _interrupted_then_resumed(make_cfg, tmp_path / "run", at)
    assert _equal(reference[0], _resume(make_cfg, save_dir))


@pytest.mark.parametrize("at", [3, 6])
def test_workers_with_random_augmentation_resume_exactly(make_cfg, tmp_path, reference, at):
    save_dir = _interrupted_then_resumed(make_cfg, tmp_path / "run", at, num_workers=2)
    assert _equal(reference[2], _resume(make_cfg, save_dir, num_workers=2))


def _edit_newest(save_dir, edit):
    newest = find_resume_checkpoints(save_dir)[0]
    state = torch.load(newest, weights_only=True)
    edit(state)
    torch.save(state, newest)


def test_without_the_random_state_the_resumed_run_differs(make_cfg, tmp_path, reference):
    """The negative control: the comparison above can fail."""
    save_dir = _interrupted_then_resumed(make_cfg, tmp_path / "run", 6)
    _edit_newest(save_dir, lambda state: state.pop("resume_state"))
    with pytest.warns(UserWarning, match=r"no state for \['resume_state'\]"):
        resumed = _resume(make_cfg, save_dir)
    assert not _equal(reference[0], resumed)


def _python_states(state):
    """Every rank's saved Python random states, as ``(holder, key)`` pairs."""
    for rank in state["resume_state"]["ranks"]:
        for moment in ("created", "now"):
            yield rank[moment], "python"


def _as_numbers(python_state):
    """Python's random state as a checkpoint before it was packed into bytes held it."""
    version, internal, gauss = python_state
    return version, struct.unpack(f"={len(internal) // 4}I", internal), gauss


def test_a_checkpoint_holding_pythons_random_state_as_numbers_resumes_exactly(
    make_cfg, tmp_path, reference
):
    def unpack(state):
        for holder, key in _python_states(state):
            assert isinstance(holder[key][1], bytes)  # one object to pickle, not 625
            holder[key] = _as_numbers(holder[key])

    save_dir = _interrupted_then_resumed(make_cfg, tmp_path / "run", 6)
    _edit_newest(save_dir, unpack)
    assert _equal(reference[0], _resume(make_cfg, save_dir))


def test_another_python_random_state_makes_the_resumed_run_differ(make_cfg, tmp_path, reference):
    """The negative control: the toy's augmentation draws from Python's random module."""

    def replace(state):
        for holder, key in _python_states(state):
            holder[key] = random.Random(1).getstate()

    save_dir = _interrupted_then_resumed(make_cfg, tmp_path / "run", 6)
    _edit_newest(save_dir, replace)
    assert not _equal(reference[0], _resume(make_cfg, save_dir))


def test_without_the_data_position_the_resumed_run_differs(make_cfg, tmp_path, reference):
    def forget_position(state):
        for rank in state["resume_state"]["ranks"]:
            rank["yielded"] = 0

    save_dir = _interrupted_then_resumed(make_cfg, tmp_path / "run", 6)
    _edit_newest(save_dir, forget_position)
    assert not _equal(reference[0], _resume(make_cfg, save_dir))


def test_iteration_checkpoints_are_named_and_rotated(make_cfg, tmp_path):
    cfg = make_cfg(max_epochs=2, save_every_iters=3, n_saved=2, every_val=0)
    Trainer(0, cfg).fit()
    names = sorted(p.name for p in (tmp_path / "run").glob("latest_iter*"))
    assert names == ["latest_iter_checkpoint_3.pt", "latest_iter_checkpoint_6.pt"]


def test_resume_picks_the_newest_checkpoint_of_either_kind(make_cfg, tmp_path, capsys):
    save_dir = _interrupted_then_resumed(make_cfg, tmp_path / "run", 6)
    task = Trainer(0, _cfg(make_cfg, save_dir, resume=True))
    task.fit()
    # Interrupted before iteration 6 was saved: iteration 5's file is newer than epoch 1's.
    assert f"RESUMING FROM: {save_dir / 'latest_iter_checkpoint_5.pt'}" in capsys.readouterr().out
    assert task.engines["trainer"].state.iteration == 12


def test_an_unloadable_newest_checkpoint_is_skipped_for_an_older_one(make_cfg, tmp_path, reference):
    save_dir = _interrupted_then_resumed(make_cfg, tmp_path / "run", 6)
    newest = find_resume_checkpoints(save_dir)[0]
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.warns(UserWarning, match="does not load"):
        resumed = _resume(make_cfg, save_dir)
    assert _equal(reference[0], resumed)


def test_a_custom_sampler_warns_that_the_resume_is_not_exact(make_cfg, tmp_path):
    save_dir = _interrupted_then_resumed(make_cfg, tmp_path / "run", 2)
    task = Trainer(0, _cfg(make_cfg, save_dir, resume=True))
    task.setup()

    class OwnOrder(torch.utils.data.Sampler):
        def __iter__(self):
            return iter(range(64))

        def __len__(self):
            return 64

    dataset = task.dls["train"].dataset
    task.dls["train"] = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=OwnOrder())
    with pytest.warns(UserWarning, match="OwnOrder may keep random state"):
        task.fit()


def test_no_iteration_checkpoint_at_an_epochs_end_where_the_epoch_checkpoint_follows(
    make_cfg, tmp_path
):
    """Resuming one would skip that epoch's evaluation and its latest / best files."""
    Trainer(0, make_cfg(max_epochs=2, save_every_iters=2, n_saved=None)).fit()
    names = sorted(p.name for p in (tmp_path / "run").glob("latest_*"))
    assert names == [
        "latest_epoch_checkpoint_1.pt",
        "latest_epoch_checkpoint_2.pt",
        "latest_iter_checkpoint_2.pt",
        "latest_iter_checkpoint_6.pt",
    ]


# ---- constant-time resume: the sampler moves, the workers restart in their saved state ----

COSTLY = {"n": 256, "bs": 16, "shuffle": True, "num_workers": 2}  # 16 batches per epoch


def _costly(make_cfg, save_dir, log, **fields):
    return make_cfg(
        save_dir=str(save_dir),
        **{
            **_fields(2),
            "max_epochs": 2,
            "train_ds_params": {**COSTLY, "load_log": str(log)},
            **fields,
        },
    )


@pytest.fixture(scope="module")
def costly_reference(tmp_path_factory):
    from tests.toy.config import toy_config

    tmp = tmp_path_factory.mktemp("costly")
    cfg = toy_config(
        save_dir=str(tmp / "run"),
        **{**_fields(2), "max_epochs": 2, "train_ds_params": COSTLY},
    )
    task = Trainer(0, cfg)
    task.fit()
    return _weights(task)


def _interrupt_at(task, at):
    def interrupt(engine):
        if engine.state.iteration == at:
            raise Interrupt

    task.engines["trainer"].add_event_handler(Events.ITERATION_COMPLETED, interrupt)
    with pytest.raises(Interrupt):
        task.fit()


def _loads(log):
    return len(log.read_text().split()) if log.exists() else 0


@pytest.mark.parametrize("at", [8, 13])
def test_a_resume_with_workers_loads_nothing_before_its_position_and_is_bit_identical(
    make_cfg, tmp_path, costly_reference, at, recwarn
):
    log = tmp_path / "loads.txt"
    _interrupt_at(Trainer(0, _costly(make_cfg, tmp_path / "run", log)).setup(), at)
    log.unlink()
    task = Trainer(0, _costly(make_cfg, tmp_path / "run", log, resume=True))
    task.fit()
    assert _equal(costly_reference, _weights(task))
    # Saved after iteration at-1. The workers' turns restart at an even batch: at most one
    # batch before the position is loaded again, then the rest of epoch 1 and all of epoch 2.
    saved = at - 1
    restart = saved - saved % 2
    assert _loads(log) == (16 - restart) * 16 + 256
    assert not [w for w in recwarn if "loading again" in str(w.message)]


def _strip_worker_state(state):
    for rank in state["resume_state"]["ranks"]:
        rank.pop("workers")


def test_a_checkpoint_without_worker_state_resumes_exactly_by_replaying(
    make_cfg, tmp_path, costly_reference
):
    """A checkpoint written before workers reported their state: the old, replaying way."""
    log = tmp_path / "loads.txt"
    _interrupt_at(Trainer(0, _costly(make_cfg, tmp_path / "run", log)).setup(), 13)
    _edit_newest(tmp_path / "run", _strip_worker_state)
    log.unlink()
    task = Trainer(0, _costly(make_cfg, tmp_path / "run", log, resume=True))
    with pytest.warns(UserWarning, match="loading again the 12 batches before it, because the "):
        task.fit()
    assert _equal(costly_reference, _weights(task))
    assert _loads(log) == 16 * 16 + 256


def test_without_the_worker_states_the_resumed_run_differs(make_cfg, tmp_path, costly_reference):
    """The negative control: restarting the workers fresh changes their augmentations."""

    def forget_workers(state):
        for rank in state["resume_state"]["ranks"]:
            rank["workers"] = [None, None]

    log = tmp_path / "loads.txt"
    _interrupt_at(Trainer(0, _costly(make_cfg, tmp_path / "run", log)).setup(), 13)
    _edit_newest(tmp_path / "run", forget_workers)
    task = Trainer(0, _costly(make_cfg, tmp_path / "run", log, resume=True))
    task.fit()
    assert not _equal(costly_reference, _weights(task))


# ---- an iterable dataset: in place with state_dict, replayed (and said so) without ----


def _stream(make_cfg, save_dir, workers, stateful=True, log=None, **fields):
    params = {"n": 64, "bs": 8, "num_workers": workers, "stateful": stateful}
    if log is not None:
        params["load_log"] = str(log)
    stream = {"train_ds_name": "tests.toy.data_stream", "train_ds_params": params}
    return make_cfg(save_dir=str(save_dir), **{**_fields(workers), **stream, **fields})


@pytest.fixture(scope="module")
def stream_reference(tmp_path_factory):
    from tests.toy.config import toy_config

    results = {}
    for workers in (0, 2):
        tmp = tmp_path_factory.mktemp(f"stream{workers}")
        params = {"n": 64, "bs": 8, "num_workers": workers}
        fields = {**_fields(workers), "train_ds_name": "tests.toy.data_stream"}
        cfg = toy_config(save_dir=str(tmp / "run"), **{**fields, "train_ds_params": params})
        task = Trainer(0, cfg)
        task.fit()
        results[workers] = _weights(task)
    return results


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_dataset_with_state_resumes_in_place_exactly(
    make_cfg, tmp_path, stream_reference, workers, recwarn
):
    log = tmp_path / "loads.txt"
    _interrupt_at(Trainer(0, _stream(make_cfg, tmp_path / "run", workers, log=log)).setup(), 15)
    log.unlink()
    task = Trainer(0, _stream(make_cfg, tmp_path / "run", workers, log=log, resume=True))
    task.fit()
    assert _equal(stream_reference[workers], _weights(task))
    assert not [w for w in recwarn if "loading again" in str(w.message)]
    # Saved after iteration 14, batch 6 of epoch 2's 8: from batch 6 on (no worker turn to
    # line up at an even batch), then epoch 3.
    assert _loads(log) == 2 * 8 + 64


def test_an_iterable_dataset_without_state_is_replayed_exactly_with_one_warning(
    make_cfg, tmp_path, stream_reference
):
    _interrupt_at(Trainer(0, _stream(make_cfg, tmp_path / "run", 2, stateful=False)).setup(), 15)
    task = Trainer(0, _stream(make_cfg, tmp_path / "run", 2, stateful=False, resume=True))
    with pytest.warns(UserWarning) as seen:
        task.fit()
    replays = [str(w.message) for w in seen if "loading again" in str(w.message)]
    assert replays == [
        "resuming at batch 6 of the pass by loading again the 6 batches before it, because the "
        "iterable dataset Stream has no state_dict/load_state_dict to resume it in place; the "
        "resume costs as much data loading as those iterations did."
    ]
    assert _equal(stream_reference[2], _weights(task))
