"""Exact resume in one process: interrupted anywhere, the resumed run ends on the same weights."""

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
