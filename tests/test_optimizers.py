"""Behaviour of the built-in optimizers and parameter grouping (contract 9.2)."""

import pytest
import torch
from torch import nn

import gatle_ignite
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.optimizers import adam, adamw, layer_decay, sgd
from gatle_ignite.optimizers.grouping import get_grouped_params


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.norm = nn.LayerNorm(3)
        self.frozen = nn.Linear(3, 2)
        self.frozen.requires_grad_(False)


class Block(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.attn = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)


class ViTish(nn.Module):
    def __init__(self, depth=3, dim=4):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 2, dim))
        self.patch_embed = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.gamma = nn.Parameter(torch.ones(dim, dim))

    def no_weight_decay(self):
        return {"gamma"}


class WithHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Module()
        self.backbone.backbone = ViTish()
        self.head = nn.Linear(4, 2)


class Wrapped(nn.Module):
    """Stands in for DDP: the real model sits under ``.module``."""

    def __init__(self, inner):
        super().__init__()
        self.module = inner


def _ids(params):
    return [id(p) for p in params]


# --- grouping -------------------------------------------------------------------------------


def test_grouping_two_groups_in_order():
    model = Tiny()
    decay, no_decay = get_grouped_params(model, 0.05)
    assert decay["weight_decay"] == 0.05
    assert no_decay["weight_decay"] == 0.0
    assert _ids(decay["params"]) == _ids([model.fc.weight])
    assert _ids(no_decay["params"]) == _ids([model.fc.bias, model.norm.weight, model.norm.bias])


def test_grouping_leaves_frozen_params_out():
    model = Tiny()
    grouped = {id(p) for group in get_grouped_params(model, 0.05) for p in group["params"]}
    assert id(model.frozen.weight) not in grouped
    assert id(model.frozen.bias) not in grouped
    (single,) = get_grouped_params(model, 0.0)
    assert id(model.frozen.weight) not in _ids(single["params"])


def test_grouping_bias_name_beats_ndim():
    model = nn.Module()
    model.layer = nn.Module()
    model.layer.bias = nn.Parameter(torch.zeros(2, 2))
    model.layer.kernel = nn.Parameter(torch.zeros(2, 2))
    decay, no_decay = get_grouped_params(model, 0.1)
    assert _ids(decay["params"]) == _ids([model.layer.kernel])
    assert _ids(no_decay["params"]) == _ids([model.layer.bias])


@pytest.mark.parametrize(("weight_decay", "flag"), [(0.0, True), (None, True), (0.1, False)])
def test_grouping_off_gives_one_group_of_all_trainable(weight_decay, flag):
    model = Tiny()
    groups = get_grouped_params(model, weight_decay, no_decay_on_bias_and_norm=flag)
    assert len(groups) == 1
    assert _ids(groups[0]["params"]) == _ids(p for p in model.parameters() if p.requires_grad)


def test_grouping_keeps_an_empty_group():
    model = nn.LayerNorm(3)
    decay, no_decay = get_grouped_params(model, 0.1)
    assert decay["params"] == []
    assert len(no_decay["params"]) == 2


# --- adam / adamw / sgd ---------------------------------------------------------------------


def test_adam_betas_become_a_tuple_from_config_lists():
    cfg = gatle_ignite.base_config()
    cfg.optimizer_params = {"lr": 0.01, "betas": [0.8, 0.9]}
    optimizer = adam.get_optimizer(Tiny(), **cfg.optimizer_params)
    assert type(optimizer) is torch.optim.Adam
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.9)
    assert optimizer.param_groups[0]["lr"] == 0.01


def test_adam_only_trainable_params_and_no_grouping():
    model = Tiny()
    optimizer = adam.get_optimizer(model, weight_decay=0.1)
    assert len(optimizer.param_groups) == 1
    assert _ids(optimizer.param_groups[0]["params"]) == _ids(
        p for p in model.parameters() if p.requires_grad
    )
    assert optimizer.param_groups[0]["weight_decay"] == 0.1


def test_adamw_groups_and_defaults():
    model = Tiny()
    optimizer = adamw.get_optimizer(model, betas=[0.5, 0.6])
    assert type(optimizer) is torch.optim.AdamW
    decay, no_decay = optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
    assert decay["lr"] == 1e-3
    assert decay["betas"] == (0.5, 0.6)
    assert decay["eps"] == 1e-8


def test_adamw_flag_off_decays_everything():
    optimizer = adamw.get_optimizer(Tiny(), weight_decay=0.2, no_decay_on_bias_and_norm=False)
    (group,) = optimizer.param_groups
    assert group["weight_decay"] == 0.2


def test_sgd_defaults_and_grouping():
    optimizer = sgd.get_optimizer(Tiny())
    assert type(optimizer) is torch.optim.SGD
    (group,) = optimizer.param_groups
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.1, 0.9, True)
    grouped = sgd.get_optimizer(Tiny(), weight_decay=1e-4)
    assert [g["weight_decay"] for g in grouped.param_groups] == [1e-4, 0.0]


@pytest.mark.parametrize("module", [adam, adamw, sgd, layer_decay])
def test_optimizers_go_through_idist_auto_optim(module, monkeypatch):
    seen = []

    def fake_auto_optim(optimizer, **kwargs):
        seen.append(optimizer)
        return "wrapped"

    monkeypatch.setattr(module.idist, "auto_optim", fake_auto_optim)
    assert module.get_optimizer(ViTish()) == "wrapped"
    assert isinstance(seen[0], torch.optim.Optimizer)


# --- layer_decay ----------------------------------------------------------------------------


def _groups_by_param(optimizer, model):
    names = {id(p): name for name, p in model.named_parameters()}
    return {names[id(p)]: group for group in optimizer.param_groups for p in group["params"]}


def test_layer_decay_depths_and_lrs():
    model = ViTish(depth=3)
    lr, decay = 1e-3, 0.5
    optimizer = layer_decay.get_optimizer(model, lr=lr, layer_decay=decay)
    by_param = _groups_by_param(optimizer, model)
    n_layers = 4

    def expected(depth):
        return lr * decay ** (n_layers - depth)

    assert by_param["cls_token"]["lr"] == pytest.approx(expected(0))
    assert by_param["patch_embed.weight"]["lr"] == pytest.approx(expected(0))
    assert by_param["blocks.0.attn.weight"]["lr"] == pytest.approx(expected(1))
    assert by_param["blocks.2.attn.weight"]["lr"] == pytest.approx(expected(3))
    assert by_param["gamma"]["lr"] == pytest.approx(lr)
    lrs = {g["lr"] for g in optimizer.param_groups}
    assert len(lrs) > 1
    assert max(lrs) <= lr


def test_layer_decay_weight_decay_rules():
    model = ViTish()
    optimizer = layer_decay.get_optimizer(model, weight_decay=0.05)
    by_param = _groups_by_param(optimizer, model)
    assert by_param["blocks.1.attn.weight"]["weight_decay"] == 0.05
    assert by_param["blocks.1.attn.bias"]["weight_decay"] == 0.0
    assert by_param["blocks.1.norm.weight"]["weight_decay"] == 0.0
    # listed by the backbone's no_weight_decay() although it is 2-d
    assert by_param["gamma"]["weight_decay"] == 0.0
    assert by_param["cls_token"]["weight_decay"] == 0.05


def test_layer_decay_group_layout():
    model = ViTish(depth=2)
    optimizer = layer_decay.get_optimizer(model, lr=1e-3, betas=[0.7, 0.8])
    assert type(optimizer) is torch.optim.AdamW
    for group in optimizer.param_groups:
        assert group["betas"] == (0.7, 0.8)
    total = sum(len(g["params"]) for g in optimizer.param_groups)
    assert total == len(list(model.parameters()))
    keys = {(round(g["lr"], 12), g["weight_decay"]) for g in optimizer.param_groups}
    assert len(keys) == len(optimizer.param_groups)


def test_layer_decay_follows_backbone_attr_and_unwraps_module():
    model = Wrapped(WithHead())
    optimizer = layer_decay.get_optimizer(
        model, lr=1.0, layer_decay=0.5, backbone_attr="backbone.backbone"
    )
    by_param = _groups_by_param(optimizer, model)
    assert by_param["module.head.weight"]["lr"] == 1.0
    assert by_param["module.backbone.backbone.blocks.0.attn.weight"]["lr"] == pytest.approx(0.125)
    # no_weight_decay() names are relative to the backbone, matched as a suffix
    assert by_param["module.backbone.backbone.gamma"]["weight_decay"] == 0.0


def test_layer_decay_leaves_frozen_params_out():
    model = ViTish()
    model.blocks[0].requires_grad_(False)
    optimizer = layer_decay.get_optimizer(model)
    grouped = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert id(model.blocks[0].attn.weight) not in grouped


def test_layer_decay_bad_backbone_attr():
    with pytest.raises(ConfigError, match="does not resolve") as info:
        layer_decay.get_optimizer(WithHead(), backbone_attr="backbone.trunk")
    message = str(info.value)
    assert "backbone_attr 'backbone.trunk'" in message
    assert "has no attribute 'trunk'" in message
    assert "Available: ['backbone']" in message


def test_layer_decay_missing_blocks():
    with pytest.raises(ConfigError, match="blocks_attr 'blocks' not found on WithHead"):
        layer_decay.get_optimizer(WithHead())
    with pytest.raises(ConfigError, match="blocks_attr 'layers'"):
        layer_decay.get_optimizer(ViTish(), blocks_attr="layers")
