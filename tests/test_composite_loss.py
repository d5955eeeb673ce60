"""Behaviour of the composite criterion ``gatle_ignite.losses.composite.Loss`` (contract 9.3)."""

import sys

import pytest
import torch
from torch import nn

import gatle_ignite
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.losses.composite import Loss

CONST_TERM = '''
import torch
from torch import nn


class Loss(nn.Module):
    """Returns ``value``; records how it was called."""

    def __init__(self, value=1.0):
        super().__init__()
        self.register_buffer("value", torch.tensor(float(value)))
        self.calls = []

    def forward(self, y_pred, target, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.value.clone()
'''

CE_TERM = """
from torch import nn
from torch.nn import functional as F

from gatle_ignite.utils.batch import get_value


class Loss(nn.Module):
    def __init__(self, src_name="logits", tgt_name=("targets", "labels")):
        super().__init__()
        self.src_name = src_name
        self.tgt_name = tgt_name

    def forward(self, y_pred, target, iteration=None):
        return F.cross_entropy(get_value(y_pred, self.src_name), get_value(target, self.tgt_name))
"""


@pytest.fixture
def terms(tmp_path, monkeypatch):
    """Dotted paths of two throw-away sub-loss modules put on sys.path for this test."""
    paths = {"const": "gi_composite_const_term", "ce": "gi_composite_ce_term"}
    for key, source in (("const", CONST_TERM), ("ce", CE_TERM)):
        (tmp_path / f"{paths[key]}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield paths
    for name in paths.values():
        sys.modules.pop(name, None)


def _batch():
    y_pred = {"logits": torch.tensor([[2.0, 0.0], [0.0, 1.0]])}
    target = {"targets": {"labels": torch.tensor([0, 1])}}
    return y_pred, target


def _const(terms, weight=1.0, value=1.0, **extra):
    return {"cls_name": terms["const"], "loss_params": {"value": value}, "weight": weight, **extra}


# --- construction ---------------------------------------------------------------------------


@pytest.mark.parametrize("empty", [{}, None])
def test_empty_mapping_is_refused(empty):
    with pytest.raises(ConfigError, match="at least one sub-loss") as info:
        Loss(empty)
    assert "dict_of_loss_params is empty" in str(info.value)


def test_empty_configdict_is_refused():
    cfg = gatle_ignite.base_config()
    cfg.criterion_params = {"dict_of_loss_params": {}}
    with pytest.raises(ConfigError, match="at least one sub-loss"):
        Loss(**cfg.criterion_params)


def test_entry_without_cls_name(terms):
    with pytest.raises(ConfigError, match="loss entry 'ce' is missing 'cls_name'"):
        Loss({"ce": {"weight": 1.0}})


def test_entry_without_weight(terms):
    with pytest.raises(ConfigError, match="loss entry 'ce' is missing 'weight'"):
        Loss({"ce": {"cls_name": terms["ce"]}})


def test_cls_name_is_checked_before_weight():
    with pytest.raises(ConfigError, match="is missing 'cls_name'"):
        Loss({"ce": {}})


def test_unresolvable_sub_loss_names_its_entry_field():
    with pytest.raises(ConfigError, match="dict_of_loss_params.ce.cls_name"):
        Loss({"ce": {"cls_name": "gi_no_such_loss_module", "weight": 1.0}})


def test_sub_losses_live_in_a_module_dict(terms):
    criterion = Loss({"ce": {"cls_name": terms["ce"], "weight": 1.0}, "aux": _const(terms)})
    assert isinstance(criterion.dict_loss_functions, nn.ModuleDict)
    names = dict(criterion.named_modules())
    assert "dict_loss_functions.ce" in names
    assert "dict_loss_functions.aux" in names
    assert "dict_loss_functions.aux.value" in criterion.state_dict()
    criterion.to(torch.float64)
    assert criterion.dict_loss_functions["aux"].value.dtype == torch.float64


def test_crit_keys_weighting_and_gating_follow_the_config(terms):
    criterion = Loss(
        {
            "ce": {"cls_name": terms["ce"], "weight": 2.0, "start_iteration": 5},
            "aux": _const(terms, weight=0.5, end_iteration=9),
        }
    )
    assert criterion.crit_keys == ["ce", "aux"]
    assert criterion.weighting == {"ce": 2.0, "aux": 0.5}
    assert criterion.gating == {"ce": (5, None), "aux": (None, 9)}


def test_built_from_a_configdict_like_the_trainer_does(terms):
    cfg = gatle_ignite.base_config()
    cfg.criterion_params = {
        "dict_of_loss_params": {
            "ce": {
                "cls_name": terms["ce"],
                "loss_params": {"src_name": "logits", "tgt_name": ("targets", "labels")},
                "weight": 1.0,
            }
        }
    }
    criterion = Loss(**cfg.criterion_params)
    total, components = criterion(*_batch(), iteration=1)
    assert set(components) == {"loss_ce"}
    assert total.item() > 0


# --- forward --------------------------------------------------------------------------------


def test_forward_returns_total_and_weighted_components(terms):
    y_pred, target = _batch()
    plain = Loss({"ce": {"cls_name": terms["ce"], "weight": 1.0}})
    halved = Loss({"ce": {"cls_name": terms["ce"], "weight": 0.5}})
    full_total, full = plain(y_pred, target)
    half_total, half = halved(y_pred, target)
    assert half["loss_ce"].item() == pytest.approx(0.5 * full["loss_ce"].item())
    assert half_total.item() == pytest.approx(0.5 * full_total.item())


def test_total_is_the_sum_of_weighted_terms(terms):
    criterion = Loss({"a": _const(terms, weight=2.0, value=3.0), "b": _const(terms, value=0.5)})
    total, components = criterion(*_batch(), iteration=None)
    assert components["loss_a"].item() == pytest.approx(6.0)
    assert components["loss_b"].item() == pytest.approx(0.5)
    assert total.item() == pytest.approx(6.5)


def test_iteration_reaches_the_sub_loss_positionally(terms):
    criterion = Loss({"a": _const(terms)})
    criterion(*_batch(), iteration=7)
    assert criterion.dict_loss_functions["a"].calls == [((7,), {})]


def test_start_iteration_gates_the_term(terms):
    criterion = Loss(
        {"ce": {"cls_name": terms["ce"], "weight": 1.0, "start_iteration": 100}, "b": _const(terms)}
    )
    y_pred, target = _batch()
    total, components = criterion(y_pred, target, iteration=1)
    assert components["loss_ce"].item() == 0.0
    assert components["loss_ce"].dim() == 0
    assert total.item() == pytest.approx(1.0)
    _, components = criterion(y_pred, target, iteration=101)
    assert components["loss_ce"].item() > 0


def test_gating_bounds_are_inclusive(terms):
    criterion = Loss(
        {
            "gated": _const(terms, value=2.0, start_iteration=10, end_iteration=20),
            "always": _const(terms),
        }
    )
    active = {i: criterion(*_batch(), iteration=i)[1]["loss_gated"].item() for i in (9, 10, 20, 21)}
    assert active == {9: 0.0, 10: 2.0, 20: 2.0, 21: 0.0}


def test_no_iteration_means_every_term_is_active(terms):
    criterion = Loss({"late": _const(terms, start_iteration=100)})
    total, _ = criterion(*_batch())
    assert total.item() == pytest.approx(1.0)


def test_inactive_term_does_not_call_the_sub_loss(terms):
    criterion = Loss({"late": _const(terms, start_iteration=100), "b": _const(terms)})
    criterion(*_batch(), iteration=1)
    assert criterion.dict_loss_functions["late"].calls == []


def test_gated_zero_sits_on_the_first_tensor_of_y_pred(terms):
    criterion = Loss({"late": _const(terms, start_iteration=100), "b": _const(terms)})
    y_pred = {"meta": "not a tensor", "logits": torch.zeros(2, 2, device="meta")}
    _, components = criterion(y_pred, None, iteration=1)
    assert components["loss_late"].device.type == "meta"


def test_all_terms_gated_off_is_an_error(terms):
    criterion = Loss({"late": _const(terms, start_iteration=100)})
    with pytest.raises(ConfigError, match="all loss terms are gated off at iteration 1"):
        criterion(*_batch(), iteration=1)
