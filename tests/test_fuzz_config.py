"""Fuzzing bad input: every override value and config shape either trains or is refused with a
ConfigError (exit code 2, no traceback), and a refused run leaves the checkpoints alone."""

import contextlib
import hashlib
import io
import shutil

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gatle_ignite.callbacks.logging import BUILTIN_BACKENDS
from gatle_ignite.cli.main import main
from tests.toy.config import toy_config
from tests.toy.trainer import Trainer

FIELDS = (
    "max_epochs",
    "every_val",
    "every_test",
    "train_length",
    "val_length",
    "log_every",
    "accum_steps",
    "n_saved",
    "save_ckpt",
    "resume",
    "seed",
    "amp_dtype",
    "compile",
    "grad_clip_norm",
    "grad_clip_value",
    "score_factor",
    "score_name",
    "logger_name",
    "early_stop_patience",
    "early_stop_after",
    "save_every_iters",
    "model_checkpoint_dir",
    "strict",
    "watch_grad",
    "lr_scheduler",
    "train_ds_params.bs",
    "train_ds_params.num_workers",
    "train_ds_params.shuffle",
    "train_ds_params.drop_last",
    "optimizer_params.lr",
    "max_epochs.nested",
    "no_such_field",
)

small_ints = st.integers(min_value=-3, max_value=3)
texts = st.text(alphabet="abcvalid/_.0123 ", max_size=12).filter(
    lambda t: t.strip() not in BUILTIN_BACKENDS or t.strip() == "text"
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    small_ints,
    st.floats(min_value=-2, max_value=2) | st.sampled_from([float("nan"), float("inf")]),
    texts,
)
values = st.one_of(
    scalars,
    st.lists(st.one_of(small_ints, texts), max_size=3),
    st.dictionaries(texts, small_ints, max_size=2),
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A finished run's checkpoints, copied afresh into each example's save_dir."""
    source = tmp_path_factory.mktemp("pristine")
    cfg = toy_config(save_dir=str(source), max_epochs=1, train_length=2, val_length=1)
    Trainer(0, cfg).fit()
    return source


def _digest(save_dir):
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(save_dir.glob("*.pt"))
    }


def _source(value) -> str:
    """Python source for ``value``; repr() of a non-finite float is not valid source."""
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return f"float({str(value)!r})"
    return repr(value)


def _write_config(path, save_dir, shape):
    lines = [
        "from tests.toy.config import toy_config",
        "",
        "",
        "def get_config():",
        f"    cfg = toy_config(save_dir={str(save_dir)!r}, max_epochs=1, train_length=2,",
        "                     val_length=1)",
    ]
    if shape is not None:
        field, value = shape
        lines += ["    with cfg.ignore_type():", f"        cfg.{field} = {_source(value)}"]
    lines.append("    return cfg")
    path.write_text("\n".join(lines) + "\n")


def _run(tmp_path, pristine, overrides, shape=None):
    save_dir = tmp_path / "run"
    shutil.rmtree(save_dir, ignore_errors=True)
    shutil.copytree(pristine, save_dir)
    before = _digest(save_dir)
    config = tmp_path / "fuzzed.py"
    _write_config(config, save_dir, shape)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", f"--config={config}", *(f"--override={o}" for o in overrides)])
    assert code in (0, 2), (code, err.getvalue())
    if code == 2:
        assert err.getvalue().startswith("\nconfig error: ")
        assert "Traceback" not in err.getvalue()
        changed = {k: v for k, v in _digest(save_dir).items() if before.get(k, v) != v}
        assert not changed, f"a refused run modified {sorted(changed)}"
    return code


def _keep_it_small(field, value):
    # Valid values that would only make an example slow, not wrong.
    assume(not (field == "compile" and value in (True, "auto")))
    assume(not (field == "train_ds_params.num_workers" and value not in (0, 1)))


FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(field=st.sampled_from(FIELDS), value=values, raw=st.booleans())
def test_an_override_either_trains_or_is_a_config_error(tmp_path, pristine, field, value, raw):
    _keep_it_small(field, value)
    text = str(value) if raw else repr(value)
    _run(tmp_path, pristine, [f"{field}={text}"])


@FUZZ
@given(field=st.sampled_from([f for f in FIELDS if "." not in f]), value=values)
def test_a_config_shape_either_trains_or_is_a_config_error(tmp_path, pristine, field, value):
    _keep_it_small(field, value)
    _run(tmp_path, pristine, [], shape=(field, value))


@FUZZ
@given(item=st.text(max_size=20))
def test_any_override_text_either_trains_or_is_a_config_error(tmp_path, pristine, item):
    _run(tmp_path, pristine, [item])
