"""Snapshots of checkpoint state: equal only when the checkpoint would hold the same values."""

import numpy as np
import torch

from gatle_ignite.run.unchanged_state import LastWrite, snapshot


def _state(big, small, step=3):
    return {"model": {"w": big}, "rng": small, "trainer": {"iteration": step}, "names": ["a"]}


def test_the_same_state_twice_gives_equal_snapshots():
    big, small = torch.randn(100_000), torch.arange(10)
    assert snapshot(_state(big, small)) == snapshot(_state(big.detach(), small.clone()))


def test_any_change_makes_the_snapshots_differ():
    big, small = torch.randn(100_000), torch.arange(10)
    before = snapshot(_state(big, small))
    assert before != snapshot(_state(big, small, step=4))
    assert before != snapshot(_state(big, small + 1))
    assert before != snapshot(_state(big.clone(), small))  # same values, another tensor
    big.mul_(1.0)  # an in-place write, even one that keeps the values, bumps the version
    assert before != snapshot(_state(big, small))


def test_a_value_of_another_kind_gives_no_snapshot():
    assert snapshot({"array": np.zeros(3)}) is None
    assert snapshot({"sparse": torch.eye(3).to_sparse()}) is None


def test_a_missing_last_file_is_not_linked(tmp_path):
    state = snapshot(_state(torch.randn(100_000), torch.arange(3)))
    last = LastWrite()
    last.remember(tmp_path / "gone.pt", state)
    assert last.link_if_same(state, tmp_path / "new.pt") is False
    assert list(tmp_path.iterdir()) == []


def test_the_same_state_is_linked_atomically(tmp_path):
    state = snapshot(_state(torch.randn(100_000), torch.arange(3)))
    first = tmp_path / "first.pt"
    first.write_bytes(b"checkpoint")
    (tmp_path / "second.pt").write_bytes(b"older")
    last = LastWrite()
    last.remember(first, state)
    assert last.link_if_same(state, tmp_path / "second.pt") is True
    assert (tmp_path / "second.pt").read_bytes() == b"checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.pt", "second.pt"]


def test_a_small_tensor_written_in_place_after_the_snapshot_differs():
    step = torch.tensor(32.0)
    before = snapshot({"step": step})
    step += 1  # the file holds 32; the state now says 33, in this tensor or in a fresh one
    assert before != snapshot({"step": step})
    assert before != snapshot({"step": torch.tensor(33.0)})


def test_equal_numbers_of_another_type_differ():
    assert snapshot({"xs": [1, 2]}) != snapshot({"xs": [True, 2]})
    assert snapshot({"xs": [1, 2]}) != snapshot({"xs": [1.0, 2.0]})
    assert snapshot({"xs": [1, 2]}) == snapshot({"xs": [1, 2]})


def test_a_tensor_without_storage_or_version_gives_no_snapshot():
    class NoStorage(torch.Tensor):
        def data_ptr(self):
            raise RuntimeError("this tensor has no storage")

    assert snapshot({"w": torch.zeros(100_000).as_subclass(NoStorage)}) is None
    with torch.inference_mode():
        made_in_inference = torch.zeros(100_000)
    assert snapshot({"w": made_in_inference}) is None
