"""A planted sharded checkpoint runs no code: not when a command loads it, nor when one only
indexes the run directory that holds it. Nor does one read outside its directory, or cost more
time or memory than its files hold.

The payload is the real one: a ``.metadata`` pickle (protocol 4) naming ``os.system`` as the
dotted name ``"os.system"`` inside a DCP module, which pickle resolves through that module's
``os`` attribute. Its command creates a marker file; every test asserts the marker never appears,
and the negative controls show that an unpickler admitting more does create it.
"""

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata

from gatle_ignite.cli.main import main
from gatle_ignite.dispatch import ConfigError
from gatle_ignite.run import sharded, sharded_metadata
from gatle_ignite.run.directory import indexed_view
from gatle_ignite.run.layout import MANIFEST_FILE
from gatle_ignite.run.loading import load_checkpoint_file
from gatle_ignite.run.manifest import Manifest
from tests.conftest import HANG_S, ROOT, run_capped
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
        sharded_metadata._MetadataUnpickler(stream).load()


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


# ---- metadata that reads outside its directory, or claims more than its files hold ----
#
# Each is real DCP metadata (the classes DCP pickles, pickled as DCP pickles them), built from a
# checkpoint DCP wrote and changed the way a hostile or damaged copy would be. Loading only
# admits the exact globals metadata holds, so each of these passes the unpickler: what stops it
# is the check against the files present.

VICTIM_WEIGHT = 7.0


def _state(weight: float) -> dict:
    model = torch.nn.Linear(4, 3)
    torch.nn.init.constant_(model.weight, weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "trainer": {"iteration": 4, "epoch_length": 2},
    }


def _metadata(directory: Path):
    with open(directory / ".metadata", "rb") as handle:
        return pickle.load(handle)


def _write_metadata(directory: Path, metadata) -> None:
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))  # as DCP's writer does


def _pointed_elsewhere(planted: Path, victim: Path, absolute: bool) -> None:
    """Every entry read from the victim's shard: by a relative path up and into it, or by its
    absolute path."""
    metadata = _metadata(planted)
    shard = victim / "__0_0.distcp"
    name = str(shard) if absolute else f"../{victim.name}/{shard.name}"
    for info in metadata.storage_data.values():
        info.relative_path = name
    _write_metadata(planted, metadata)


def _renamed(metadata, old: str, new: str, path: tuple) -> None:
    """The entry ``old`` moved to ``new``, at ``path``, consistently in every index."""
    metadata.state_dict_metadata[new] = metadata.state_dict_metadata.pop(old)
    metadata.planner_data.pop(old)
    metadata.planner_data[new] = path
    index = dcp_metadata.MetadataIndex(old)
    metadata.storage_data[dcp_metadata.MetadataIndex(new)] = metadata.storage_data.pop(index)


HUGE_INDEX = 10**9


def _huge_list_index(planted: Path, _victim: Path) -> None:
    """An optimizer's param group placed at list position 10**9: a skeleton padded to it."""
    metadata = _metadata(planted)
    old = "optimizer.param_groups.0.lr"
    new = f"optimizer.param_groups.{HUGE_INDEX}.lr"
    _renamed(metadata, old, new, ("optimizer", "param_groups", HUGE_INDEX, "lr"))
    _write_metadata(planted, metadata)


HUGE_SIZE = torch.Size([2**20, 2**20])


def _huge_tensor(planted: Path, _victim: Path) -> None:
    """The weight claims 2**40 elements (4 TiB); its one chunk still holds 12."""
    metadata = _metadata(planted)
    metadata.state_dict_metadata["model.weight"].size = HUGE_SIZE
    _write_metadata(planted, metadata)


def _chunk_beyond_its_bytes(planted: Path, _victim: Path) -> None:
    """The weight and its chunk claim 4096 x 4096 floats (64 MiB), stored in 1.5 KB."""
    metadata = _metadata(planted)
    weight = metadata.state_dict_metadata["model.weight"]
    weight.size = weight.chunks[0].sizes = torch.Size([4096, 4096])
    _write_metadata(planted, metadata)


def _overlapping(planted: Path, _victim: Path) -> None:
    """Two entries read from the same bytes, which DCP never writes twice."""
    metadata = _metadata(planted)
    infos = list(metadata.storage_data.values())
    infos[1].offset, infos[1].length = infos[0].offset, infos[0].length
    _write_metadata(planted, metadata)


def _truncated_shard(planted: Path, _victim: Path) -> None:
    """A shard cut short, as an interrupted copy leaves it."""
    shard = planted / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def memo_bomb() -> bytes:
    """A 13-byte pickle that stores None at memo slot 2**30: Python's C unpickler sizes its
    memo to twice that index up front (16 GiB) before reading on."""
    return (
        pickle.PROTO
        + bytes([4])
        + pickle.NONE
        + pickle.LONG_BINPUT
        + struct.pack("<I", 2**30)
        + pickle.STOP
    )


def _memo_bomb(planted: Path, _victim: Path) -> None:
    (planted / ".metadata").write_bytes(memo_bomb())


def _fifo(planted: Path, _victim: Path) -> None:
    (planted / ".metadata").unlink()
    os.mkfifo(planted / ".metadata")


# (name, change, refused outright (reads outside) or damaged, what the one line says)
HOSTILE = [
    ("parent-path", lambda p, v: _pointed_elsewhere(p, v, False), True, "'../victim.dcp/"),
    ("absolute-path", lambda p, v: _pointed_elsewhere(p, v, True), True, "victim.dcp/__0_0"),
    ("huge-list-index", _huge_list_index, False, "list positions up to 1000000001"),
    ("huge-tensor", _huge_tensor, False, "has 1099511627776 elements, and its chunks hold 12"),
    ("chunk-beyond-its-bytes", _chunk_beyond_its_bytes, False, "needs 67108864 bytes"),
    ("overlapping", _overlapping, False, "overlap in __0_0.distcp"),
    ("truncated-shard", _truncated_shard, False, "(truncated, or not this checkpoint's shard)"),
    ("memo-bomb", _memo_bomb, False, "it holds a NoneType, not DCP's metadata"),
    ("fifo", _fifo, False, "a named pipe (FIFO), not a regular file"),
]
# What each would cost without the checks is more than a test machine can give (or forever),
# so each runs in a child process whose address space is capped and whose time is bounded.


@pytest.fixture
def planted_and_victim(tmp_path) -> tuple:
    """Two real checkpoints of the same shapes: one to plant, one holding the victim's weights
    (all 7.0) beside it."""
    planted, victim = tmp_path / "planted.dcp", tmp_path / "victim.dcp"
    torch.distributed.checkpoint.save(_state(1.0), checkpoint_id=planted, no_dist=True)
    torch.distributed.checkpoint.save(_state(VICTIM_WEIGHT), checkpoint_id=victim, no_dist=True)
    return planted, victim


@pytest.mark.parametrize(
    "change, outside, says", [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE]
)
def test_consolidate_refuses_metadata_its_files_cannot_back_in_one_line(
    planted_and_victim, tmp_path, change, outside, says
):
    planted, victim = planted_and_victim
    change(planted, victim)
    out = tmp_path / "merged.pt"
    done = run_capped([sys.executable, "-m", "gatle_ignite", "consolidate", str(planted), str(out)])
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    if outside:
        assert lines[0].startswith(f"config error: refusing to load {planted / '.metadata'}: ")
        assert lines[0].endswith("nothing was read from it.")
    else:
        assert lines[0].startswith(f"config error: cannot consolidate {planted}: ")
    assert says in lines[0]
    assert not out.exists()


# ---- the negative controls: each hostile file is live without the checks ----


@pytest.mark.parametrize("absolute", [False, True], ids=["parent-path", "absolute-path"])
def test_dcps_own_reader_follows_a_shard_path_out_of_the_directory(planted_and_victim, absolute):
    planted, victim = planted_and_victim
    _pointed_elsewhere(planted, victim, absolute)
    template = _state(0.0)
    torch.distributed.checkpoint.load(
        template, storage_reader=FileSystemReader(planted), no_dist=True
    )
    assert torch.equal(template["model"]["weight"], torch.full((3, 4), VICTIM_WEIGHT))


def test_the_hostile_metadata_passes_the_unpickler_and_would_be_allocated(planted_and_victim):
    """What the restricted unpickler admits of each: the index and the size, as claimed; the
    skeleton grows with a list position, and the claimed size fails in torch's allocator."""
    planted, victim = planted_and_victim
    _huge_list_index(planted, victim)
    metadata = sharded_metadata._MetadataUnpickler(
        io.BytesIO((planted / ".metadata").read_bytes())
    ).load()
    assert metadata.planner_data[f"optimizer.param_groups.{HUGE_INDEX}.lr"][2] == HUGE_INDEX
    # The same placement at 10**6 (not 10**9, which takes gigabytes): one slot per position.
    _renamed(
        metadata,
        f"optimizer.param_groups.{HUGE_INDEX}.lr",
        "optimizer.param_groups.1000000.lr",
        ("optimizer", "param_groups", 10**6, "lr"),
    )
    assert (
        len(sharded_metadata.skeleton(metadata, tensors=False)["optimizer"]["param_groups"])
        == 10**6 + 1
    )
    with pytest.raises(RuntimeError, match="allocate"):
        torch.empty(HUGE_SIZE)


def test_the_c_unpickler_takes_what_the_memo_index_says():
    script = (
        "import pickle, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "try:\n"
        "    pickle.loads(sys.stdin.buffer.read())\n"
        "except MemoryError:\n"
        "    sys.exit(7)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], input=memo_bomb(), timeout=HANG_S)
    assert done.returncode == 7


# ---- the same files met by the other commands ----


def test_eval_and_export_of_a_named_hostile_checkpoint_are_config_errors(
    trained, planted_and_victim, cli
):
    config, _save_dir = trained
    planted, victim = planted_and_victim
    _huge_tensor(planted, victim)
    code, _out, err = cli("eval", config, ckpt=str(planted))
    assert code == 2
    assert f"cannot load {planted}: its metadata is damaged: tensor 'model.weight' has" in err
    _pointed_elsewhere(planted, victim, absolute=False)
    code, _out, err = cli("eval", config, ckpt=str(planted))
    assert code == 2 and f"refusing to load {planted / '.metadata'}" in err


@pytest.mark.parametrize(
    "change, code",
    [(_huge_tensor, 0), (_pointed_elsewhere, 2)],
    ids=["damaged-skipped", "outside-refused"],
)
def test_a_resume_skips_a_damaged_unindexed_checkpoint_and_refuses_one_reading_outside(
    trained, planted_and_victim, capsys, change, code
):
    """Planted as the furthest-trained checkpoint of the run: a damaged one is not the run's
    (warned, left as it is), and the run resumes from its own; one that reads outside its
    directory is refused, as one holding code is."""
    config, save_dir = trained
    planted, victim = planted_and_victim
    if change is _pointed_elsewhere:
        change(planted, victim, absolute=True)
    else:
        change(planted, victim)
    os.replace(planted, save_dir / RESUMABLE)
    capsys.readouterr()
    argv = ["train", f"--config={config}", "--override=resume=True", "--override=max_epochs=3"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == code
    out, err = capsys.readouterr()
    said = "\n".join(str(warning.message) for warning in caught)
    if code == 0:
        assert f"{save_dir / RESUMABLE} is no checkpoint of run" in said
        assert "its metadata is damaged" in said and "TRAIN epoch 3" in out
        indexed = json.loads((save_dir / MANIFEST_FILE).read_text())["checkpoints"]
        assert RESUMABLE not in {entry["file"] for entry in indexed}
    else:
        assert f"refusing to load {save_dir / RESUMABLE / '.metadata'}" in err
