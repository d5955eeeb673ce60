"""A planted sharded checkpoint runs no code: not when a command loads it, nor when one only
indexes the run directory that holds it.

The payload is the real one: a ``.metadata`` pickle (protocol 4) naming ``os.system`` as the
dotted name ``"os.system"`` inside a DCP module, which pickle resolves through that module's
``os`` attribute. Its command creates a marker file; every test asserts the marker never appears,
and the negative controls show that an unpickler admitting more does create it.
"""

import io
import json
import pickle
import struct
from pathlib import Path

import pytest
import torch

from gatle_ignite.cli.main import main
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run import sharded
from gatle_ignite.run.directory import indexed_view
from gatle_ignite.run.layout import MANIFEST_FILE
from gatle_ignite.run.loading import load_checkpoint_file
from gatle_ignite.run.manifest import Manifest
from tests.conftest import ROOT
from tests.toy.config_file import write_toy_config

DCP_MODULE = "torch.distributed.checkpoint.filesystem"


def _text(value: str) -> bytes:
    data = value.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def dotted_global_payload(command: str) -> bytes:
    """``os.system(command)``, named as ``os.system`` within a module of DCP's own."""
    return (
        pickle.PROTO
        + bytes([4])
        + _text(DCP_MODULE)
        + _text("os.system")
        + pickle.STACK_GLOBAL
        + _text(command)
        + pickle.TUPLE1
        + pickle.REDUCE
        + pickle.STOP
    )


def plant(directory: Path, marker: Path) -> Path:
    """A ``.dcp`` directory whose metadata runs ``touch marker``, beside a shard file."""
    directory.mkdir(parents=True)
    (directory / ".metadata").write_bytes(dotted_global_payload(f"touch '{marker}'"))
    (directory / "__0_0.distcp").write_bytes(b"\0" * 64)
    return directory


class _PrefixRuleUnpickler(pickle.Unpickler):
    """The rule 0.5's reader had: any name in a module under torch.distributed.checkpoint."""

    def find_class(self, module, name):
        if not module.startswith("torch.distributed.checkpoint."):
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")
        return super().find_class(module, name)


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "payload-ran"


# ---- the negative controls: the payload is live ----


@pytest.mark.parametrize("unpickler", [pickle.Unpickler, _PrefixRuleUnpickler])
def test_the_payload_runs_under_a_permissive_unpickler(tmp_path, marker, unpickler):
    planted = plant(tmp_path / "latest_iter_checkpoint_5.dcp", marker)
    with open(planted / ".metadata", "rb") as handle:
        unpickler(handle).load()
    assert marker.exists()


# ---- loading ----


def test_loading_a_planted_checkpoint_is_refused_as_a_pickled_pt_is(tmp_path, marker):
    planted = plant(tmp_path / "latest_iter_checkpoint_5.dcp", marker)
    with pytest.raises(ConfigError) as refused:
        load_checkpoint_file(planted)
    message = str(refused.value)
    assert message.startswith(f"refusing to load {planted / '.metadata'}: it holds objects")
    assert f"it names {DCP_MODULE}.os.system" in message and "Nothing was executed." in message
    assert not marker.exists()


@pytest.mark.parametrize(
    "module, name",
    [
        # Real names in DCP's modules, none of them metadata.
        (DCP_MODULE, "os"),
        (DCP_MODULE, "FileSystemReader"),
        ("torch.distributed.checkpoint.metadata", "Metadata.__init__"),
        ("torch", "load"),
        ("pathlib", "Path"),
        ("builtins", "getattr"),
    ],
)
def test_no_other_global_is_admitted(module, name):
    stream = io.BytesIO(
        pickle.PROTO + bytes([4]) + _text(module) + _text(name) + pickle.STACK_GLOBAL + pickle.STOP
    )
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
        sharded._MetadataUnpickler(stream).load()


def test_what_dcp_writes_still_loads(tmp_path):
    """Every kind of entry a run's checkpoint holds: tensors of several dtypes and memory
    formats, nested optimizer state, and non-tensor values."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "trainer": {"iteration": 30, "epoch_length": 10},
        "rng": torch.get_rng_state(),
        "half": torch.randn(3, dtype=torch.bfloat16),
        "image": torch.randn(1, 2, 3, 3).to(memory_format=torch.channels_last),
    }
    torch.distributed.checkpoint.save(state, checkpoint_id=tmp_path / "c.dcp", no_dist=True)
    full = load_checkpoint_file(tmp_path / "c.dcp").full()
    assert full["trainer"] == state["trainer"]
    assert torch.equal(full["model"]["0.weight"], state["model"]["0.weight"])
    assert torch.equal(full["half"], state["half"]) and torch.equal(full["rng"], state["rng"])


# ---- every command that meets the directory ----


@pytest.fixture
def trained(tmp_path, monkeypatch):
    """A finished toy run (2 epochs, 2 iterations each) and its config file."""
    monkeypatch.chdir(ROOT)
    save_dir = tmp_path / "run"
    config = write_toy_config(
        tmp_path / "toy.py",
        save_dir=str(save_dir),
        max_epochs=2,
        train_ds_params={"n": 32, "bs": 16, "shuffle": True, "seed": 0},
    )
    assert main(["train", f"--config={config}"]) == 0
    return config, save_dir


@pytest.fixture
def metadata_reads(monkeypatch) -> list:
    """The name of every .dcp directory whose metadata is read, however safely."""
    reads = []
    read = sharded._SafeReader.read_metadata

    def counted(reader, *args, **kwargs):
        reads.append(Path(reader.path).name)
        return read(reader, *args, **kwargs)

    monkeypatch.setattr(sharded._SafeReader, "read_metadata", counted)
    return reads


# Named as the furthest-trained resumable checkpoint and as the best one (an accuracy of 2), so
# that every command that picks one picks it.
RESUMABLE, BEST = "latest_iter_checkpoint_5.dcp", "valid_best_result_checkpoint_9_2.0.dcp"


@pytest.mark.parametrize(
    "command, code, read",
    [
        # A fresh start is refused for the run already there: indexing reads names only.
        (["train"], 2, []),
        (["train", "--override=replace_run=True"], 0, []),
        (["status"], 0, []),
        # The one checkpoint a command picks is opened, and refused.
        (["train", "--override=resume=True", "--override=max_epochs=3"], 2, [RESUMABLE]),
        (["eval", "--ckpt=latest"], 2, [RESUMABLE]),
        (["eval", "--ckpt=best"], 2, [BEST]),
        (["consolidate"], 2, [RESUMABLE]),
    ],
    ids=["train", "replace_run", "status", "resume", "eval-latest", "eval-best", "consolidate"],
)
def test_no_command_runs_a_planted_checkpoint(
    trained, marker, metadata_reads, capsys, command, code, read
):
    config, save_dir = trained
    for name in (RESUMABLE, BEST):
        plant(save_dir / name, marker)
    capsys.readouterr()
    if command[0] == "status":
        argv = ["status", str(save_dir)]
    elif command[0] == "consolidate":
        argv = ["consolidate", str(save_dir / RESUMABLE), str(save_dir / "merged.pt")]
    else:
        argv = [command[0], f"--config={config}", *command[1:]]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert not marker.exists()
    assert metadata_reads == read
    if read:
        assert "refusing to load" in err and "Nothing was executed." in err


def test_an_unindexed_sharded_checkpoint_is_adopted_by_its_name(tmp_path, monkeypatch, capsys):
    """As if killed between writing a sharded epoch checkpoint and indexing it: the next start
    resumes from it, placed by its name and the run's epoch length, its metadata unread until
    it is the one chosen."""
    monkeypatch.chdir(ROOT)
    save_dir = tmp_path / "run"
    config = write_toy_config(
        tmp_path / "toy.py",
        save_dir=str(save_dir),
        strategy="fsdp",
        train_ds_params={"n": 32, "bs": 16, "shuffle": True, "seed": 0},
    )
    assert main(["train", f"--config={config}"]) == 0
    manifest = json.loads((save_dir / MANIFEST_FILE).read_text())
    newest = "latest_epoch_checkpoint_2.dcp"
    assert (save_dir / newest).is_dir() and manifest["epoch_length"] == 2
    manifest["checkpoints"] = [e for e in manifest["checkpoints"] if e["file"] != newest]
    (save_dir / MANIFEST_FILE).write_text(json.dumps(manifest))
    adopted = indexed_view(save_dir, Manifest.read(save_dir))[-1]
    assert (adopted.file, adopted.epoch, adopted.iteration) == (newest, 2, 4)
    capsys.readouterr()

    resume = ["--override=resume=True", "--override=max_epochs=3"]
    assert main(["train", f"--config={config}", *resume]) == 0
    out = capsys.readouterr().out
    assert newest in out and "TRAIN epoch 3" in out
