"""Build test configs in memory or as config files, wired to the fixture modules."""

from pathlib import Path

from gatle_ignite import base_config

COMPONENTS = "cli_fixtures.components"


def required_fields(save_dir="unused-save-dir") -> dict:
    """Every required field, set to paths that resolve; one process, so no worker is spawned."""
    return {
        "name": "good",
        "save_dir": str(save_dir),
        "main_runner": "cli_fixtures.trainer",
        "model_name": COMPONENTS,
        "train_ds_name": COMPONENTS,
        "criterion_name": COMPONENTS,
        "optimizer_name": COMPONENTS,
        "nproc_per_node": 1,
    }


def make_config(**fields):
    """``base_config()`` with the required fields set, then ``fields``."""
    cfg = base_config()
    for key, value in {**required_fields(), **fields}.items():
        setattr(cfg, key, value)
    return cfg


def write_config(directory, stem="cfg", complete=True, **fields) -> Path:
    """Write ``<directory>/<stem>.py`` whose get_config() sets ``fields`` on base_config().

    With ``complete`` the required fields are filled in first, so the config validates.
    """
    values = {**required_fields(Path(directory) / f"{stem}_run"), **fields} if complete else fields
    lines = ["from gatle_ignite import base_config", "", "", "def get_config():"]
    lines.append("    cfg = base_config()")
    lines += [f"    cfg.{key} = {value!r}" for key, value in values.items()]
    lines.append("    return cfg")
    path = Path(directory) / f"{stem}.py"
    path.write_text("\n".join(lines) + "\n")
    return path
