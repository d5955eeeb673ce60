"""The documentation: the config reference covers the config, and the site builds strictly."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gatle_ignite.config.base import OPTIONAL_KNOWN, base_config
from gatle_ignite.config.reference import (
    DS_PARAMS_DOCS,
    FIELD_DOCS,
    FIELD_GROUPS,
    LOSS_ENTRY_DOCS,
    UNDECLARED_FIELD_DOCS,
)
from tests.conftest import HANG_S

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = sorted(p.name for p in (ROOT / "examples").iterdir() if (p / "README.md").is_file())
DOCS_PACKAGES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "matplotlib")


def _config_fields() -> set:
    return set(base_config().keys()) | set(OPTIONAL_KNOWN)


def test_field_docs_cover_exactly_the_config_fields():
    fields = _config_fields()
    missing = sorted(fields - set(FIELD_DOCS))
    stale = sorted(set(FIELD_DOCS) - fields)
    assert not missing, (
        f"config fields without documentation: {missing}. Add each to FIELD_DOCS (and to a "
        f"FIELD_GROUPS section) in src/gatle_ignite/config/reference.py."
    )
    assert not stale, f"FIELD_DOCS documents fields the config does not have: {stale}"


def test_save_every_iters_is_documented():
    assert "save_every_iters" in base_config()
    assert "latest_iter" in FIELD_DOCS["save_every_iters"]


def test_field_groups_list_every_documented_field_once():
    grouped = [name for _title, names in FIELD_GROUPS for name in names]
    assert sorted(grouped) == sorted(FIELD_DOCS), "FIELD_GROUPS must hold each field exactly once"
    titles = [title for title, _names in FIELD_GROUPS]
    assert len(titles) == len(set(titles))


@pytest.mark.parametrize(
    "table", [FIELD_DOCS, UNDECLARED_FIELD_DOCS, DS_PARAMS_DOCS, LOSS_ENTRY_DOCS]
)
def test_every_meaning_is_a_sentence(table):
    for key, text in table.items():
        assert isinstance(text, str) and len(text.strip()) > 10, key
        assert "|" not in text and "\n" not in text, f"{key}: breaks a markdown table row"


def test_undeclared_fields_are_not_config_fields():
    # The undeclared table is for fields base_config() does not create.
    assert not set(UNDECLARED_FIELD_DOCS) & _config_fields()


def test_every_example_has_a_page_and_recorded_curves():
    for example in EXAMPLES:
        page = DOCS / "examples" / f"{example}.md"
        assert page.is_file(), f"no documentation page for examples/{example}"
        assert f"<!-- gatle:begin example {example} -->" in page.read_text(encoding="utf-8")
        data = DOCS / "data" / example / "metrics.csv"
        assert data.is_file(), f"no training curves recorded for {example}: {data}"
        header = data.read_text(encoding="utf-8").splitlines()[0]
        assert header == "wall_time,epoch,step,name,value"
        assert (DOCS / "assets" / "curves" / example / "metrics.png").is_file()


def _generator():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_sections_in_the_pages_are_current():
    """The pages hold their generated sections themselves; each must be what the code
    generates now."""
    stale = [str(path.relative_to(ROOT)) for path in _generator().stale()]
    assert not stale, (
        f"generated sections are stale in {stale}: run `python scripts/gen_docs.py` and commit "
        f"what it writes"
    )


def test_the_pages_read_as_files_with_no_marker_left_to_fill():
    generator = _generator()
    pages = generator.pages()
    assert DOCS / "reference" / "config.md" in pages and DOCS / "examples" / "digits.md" in pages
    for path in pages:
        text = path.read_text(encoding="utf-8")
        assert not generator._BARE.search(text), f"{path}: a marker no section was written for"
    config = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    for field in sorted(_config_fields()):
        assert f"| `{field}` |" in config, f"{field} is missing from docs/reference/config.md"
    # Every image a page shows is a file beside it.
    for path in pages:
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", path.read_text(encoding="utf-8")):
            assert (path.parent / image).resolve().is_file(), f"{path}: {image} does not exist"


def test_a_stale_or_unfilled_section_is_found():
    """The negative control: a section edited by hand, or a marker not yet written out, is
    not what the generator writes."""
    generator = _generator()
    text = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    assert generator.regenerated(text) == text
    edited = text.replace("| `max_epochs` |", "| `max_epoch` |", 1)
    assert edited != text and generator.regenerated(edited) != edited
    bare = "# Data\n\n<!-- gatle:ds-params -->\n"
    filled = generator.regenerated(bare)
    assert filled.startswith("# Data\n\n<!-- gatle:begin ds-params -->\n\n| Key | Meaning |")
    assert generator.regenerated(filled) == filled


BUILTIN_PACKAGES = (("gatle_ignite.losses", "Loss"), ("gatle_ignite.metrics", "get_metric"))


def _builtins_found(package: str, entrypoint: str) -> set:
    """Every module of ``package`` exposing ``entrypoint``: what a config can name."""
    import importlib
    import pkgutil

    found = set()
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        module = importlib.import_module(f"{package}.{info.name}")
        if hasattr(module, entrypoint):
            found.add(module.__name__)
    return found


@pytest.mark.parametrize(("package", "entrypoint"), BUILTIN_PACKAGES)
def test_the_reference_lists_every_builtin_a_config_can_name(package, entrypoint):
    import importlib

    listed = importlib.import_module(package).BUILTINS
    assert sorted(listed) == sorted(_builtins_found(package, entrypoint))


def _docs_tools_missing() -> list:
    missing = []
    for name in DOCS_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    missing = _docs_tools_missing()
    if missing:
        message = f'the docs tools are not installed ({missing}): pip install -e ".[docs]"'
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI installs the docs extra, so this is a failure")
        pytest.skip(message)
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "MPLBACKEND": "Agg"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"

    config_page = (site / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    for field in sorted(_config_fields()):
        assert f"<code>{field}</code>" in config_page, f"{field} missing from the config reference"
    for package, entrypoint in BUILTIN_PACKAGES:
        for path in _builtins_found(package, entrypoint):
            assert f"<code>{path}</code>" in config_page, f"{path} missing from the reference"
    contracts = (site / "reference" / "entrypoints" / "index.html").read_text(encoding="utf-8")
    for entrypoint in ("Trainer", "Model", "get_ds", "get_optimizer", "get_metric", "Backend"):
        assert f"<code>{entrypoint}</code>" in contracts
    for example in EXAMPLES:
        assert (site / "examples" / example / "index.html").is_file()
        png = site / "assets" / "curves" / example / "metrics.png"
        assert png.is_file() and png.read_bytes().startswith(b"\x89PNG"), png
    api = (site / "reference" / "api" / "trainer" / "index.html").read_text(encoding="utf-8")
    assert "prep_batch" in api and "BaseTrainer" in api
