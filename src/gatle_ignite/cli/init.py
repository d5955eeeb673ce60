"""``gatle-ignite init``: write a new project from the template shipped inside the package.

The project's code is one regular package named after the project (``<name>/<name>/models``,
``<name>/<name>/configs``, ...): an installed package called ``models`` or ``trainer`` cannot
shadow it, where it would shadow a top-level folder of that name.
"""

import importlib.resources
import importlib.util
import keyword
import os
from pathlib import Path

from gatle_ignite.dispatch import ConfigError

__all__ = ["init_project"]

# Only the standard library and dispatch are imported here: `init` must answer at once, without
# paying for torch and ignite.

PLACEHOLDER = "{{project_name}}"
SUFFIX = "-tpl"


def _validate(name):
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ConfigError(
            f"{name!r} is not a usable project name: it must be a Python identifier that is "
            f"not a keyword.\n"
            f"  It names the project's package, which the config imports the trainer from: "
            f"'{name}.trainer.{name}_trainer'.\n"
            f"  Use a name such as 'my_project'."
        )
    if name == "gatle_ignite":
        raise ConfigError(
            "a project named 'gatle_ignite' would shadow the framework.\n  Choose another name."
        )
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    # A namespace package has no origin; it is what `init` itself writes, so --force can re-run.
    if spec is not None and spec.origin is not None:
        raise ConfigError(
            f"{name!r} is already importable here ({spec.origin}), so the project's modules would "
            f"be shadowed or shadow it.\n  Choose another name."
        )


def _template_files(node, parts=()):
    """``(relative path parts, text)`` of every template file, in name order."""
    for child in sorted(node.iterdir(), key=lambda entry: entry.name):
        if child.is_dir():
            if child.name != "__pycache__":
                yield from _template_files(child, (*parts, child.name))
        elif child.is_file():
            yield (*parts, child.name), child.read_text(encoding="utf-8")


def _target(parts, name):
    *dirs, file_name = (part.replace(PLACEHOLDER, name) for part in parts)
    if file_name == "gitignore" + SUFFIX:
        file_name = ".gitignore"
    elif file_name.endswith(SUFFIX):
        file_name = file_name[: -len(SUFFIX)]
    return Path(*dirs, file_name)


def _report(root, written, name):
    print(f"created {root}")
    print()
    for path in sorted(str(path.relative_to(root.parent)) for path in written):
        print(f"  {path}")
    print()
    print("next steps:")
    if root.parent != Path.cwd().resolve():
        print(f"  cd {root.parent}")
    print(f"  cd {name}")
    config = f"--config={name}/configs/{name}_v0.py"
    print(f"  gatle-ignite config {config}   # validates the wiring, no GPU")
    print(f"  gatle-ignite train {config}    # trains on the CPU in seconds")
    print(f"  then read {name}/README.md: where each kind of component goes")


def init_project(name, directory=".", force=False):
    """Write the project skeleton ``<directory>/<name>``; returns the exit code (0)."""
    _validate(name)
    root = Path(directory).expanduser().resolve() / name
    source = importlib.resources.files("gatle_ignite").joinpath("_template")
    files = [
        (root / _target(parts, name), text.replace(PLACEHOLDER, name))
        for parts, text in _template_files(source)
    ]
    existing = [path for path, _ in files if os.path.lexists(path)]
    if existing and not force:
        listed = "\n".join(f"    {path}" for path in existing)
        raise ConfigError(
            f"these files already exist:\n{listed}\n"
            f"  Nothing was written. Pass --force to overwrite them, or choose another name."
        )
    for path, text in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    _report(root, [path for path, _ in files], name)
    return 0
