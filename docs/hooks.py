"""MkDocs hook: the site is built from the pages as they are, and refused when a generated
section in them is stale.

``scripts/gen_docs.py`` writes the generated sections (the config reference, the CLI help, the
example pages, ...) and the example curves into ``docs/`` itself, so a page reads the same in an
editor, on a forge and here; this hook only checks that none of them has fallen behind the
code, and that every example has a page.
"""

import importlib.util
from pathlib import Path

from mkdocs.exceptions import PluginError

_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gen_docs.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_docs", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_pre_build(config):
    generator = _generator()
    try:
        generator.check_example_pages()
        outdated = generator.stale()
    except generator.DocsError as error:
        raise PluginError(str(error)) from error
    if outdated:
        names = ", ".join(str(path.relative_to(generator.ROOT)) for path in outdated)
        raise PluginError(
            f"generated sections are stale in {names}: run `python scripts/gen_docs.py` and "
            f"commit what it writes."
        )
