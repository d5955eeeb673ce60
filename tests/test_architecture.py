"""The package's shape: every import points down a fixed order of rooms, no import circle, and
0.4's import paths are façades nothing inside uses."""

import ast
from pathlib import Path

import pytest

import gatle_ignite

PACKAGE = Path(gatle_ignite.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST, package: str, modules) -> set:
    """Every module of ``modules`` an import statement names, at module level or inside a
    function; ``from a import b`` names ``a.b`` when that is a module, else ``a``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                names.add(submodule if submodule in modules else base)
    return names


def import_graph() -> dict:
    """``{module: {modules of this package it imports}}``, lazy imports included."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = _imported(ast.parse(path.read_text(encoding="utf-8")), package, modules)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def circles(graph: dict) -> list:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert circles(import_graph()) == []


def test_the_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


# The rooms from the top down (docs layout: /work/shared/design/layout.md). A module may import
# its own layer and those below it, never one above: a module's layer is its longest prefix here.
LAYERS = (
    # What a user runs and imports: the commands, the package's lazy public names, and 0.4's
    # import paths kept for projects (nothing inside imports those; see the test below).
    ("gatle_ignite", "gatle_ignite.__main__", "gatle_ignite.cli", "gatle_ignite.utils.checkpoints"),
    ("gatle_ignite.experiments",),  # the runs and studies `runs` and `plot` read
    ("gatle_ignite.sweep",),  # a study's trials, each a `train` like any other
    ("gatle_ignite.launch",),  # which processes run a config
    # What a command does with a config before or after training it.
    ("gatle_ignite.config.preflight", "gatle_ignite.export"),
    ("gatle_ignite.trainer",),  # BaseTrainer and the handlers it attaches
    ("gatle_ignite.config",),  # loading, overrides and the checks of the config's values
    # The parts a config names, and the profiler its `profile` field schedules.
    (
        "gatle_ignite.callbacks",
        "gatle_ignite.enhancements",
        "gatle_ignite.losses",
        "gatle_ignite.metrics",
        "gatle_ignite.optimizers",
        "gatle_ignite.schedulers",
        "gatle_ignite.trainer.telemetry.profiler",
    ),
    ("gatle_ignite.run",),  # the save_dir: the only code that knows its file names
    # What any module may use: the defaults, data loaders, specs, dotted-path dispatch, what is
    # secret, and small helpers.
    (
        "gatle_ignite._version",
        "gatle_ignite.config.base",
        "gatle_ignite.config.presets",
        "gatle_ignite.data",
        "gatle_ignite.dispatch",
        "gatle_ignite.redaction",
        "gatle_ignite.specs",
        "gatle_ignite.utils",
    ),
)
# 0.4's import paths of names that live elsewhere now (CONTRACT 13.2).
OLD_PATHS = (
    "gatle_ignite.cli.launch",
    "gatle_ignite.trainer.specs",
    "gatle_ignite.utils.checkpoints",
)


def layer_of(module: str) -> int:
    """The index in LAYERS of ``module``'s longest prefix; the package itself is only itself."""
    best, found = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (
                prefix != PACKAGE.name and module.startswith(prefix + ".")
            )
            if matches and len(prefix) > best:
                best, found = len(prefix), index
    if found is None:
        raise LookupError(f"{module} is in no layer: add its room to LAYERS")
    return found


def upward_imports(graph: dict) -> list:
    """``"a -> b"`` for every import of a module from a layer above the importer's."""
    return sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        for imported in imports
        if layer_of(imported) < layer_of(module)
    )


def test_every_import_points_down():
    assert upward_imports(import_graph()) == []


def test_an_upward_import_is_found():
    graph = {
        "gatle_ignite.trainer.base": {"gatle_ignite.run.layout", "gatle_ignite.sweep.pruning"},
        "gatle_ignite.run.provenance": {"gatle_ignite"},
        "gatle_ignite.sweep.pruning": {"gatle_ignite.trainer.base"},
    }
    assert upward_imports(graph) == [
        "gatle_ignite.run.provenance -> gatle_ignite",
        "gatle_ignite.trainer.base -> gatle_ignite.sweep.pruning",
    ]


def test_every_module_is_in_a_layer():
    for module in import_graph():
        layer_of(module)
    with pytest.raises(LookupError, match="gatle_ignite.newroom.x is in no layer"):
        layer_of("gatle_ignite.newroom.x")


def test_nothing_inside_imports_an_04_path():
    graph = import_graph()
    assert [m for m, imports in graph.items() if imports & set(OLD_PATHS)] == []


def test_the_04_launcher_path_is_the_launcher_module_itself():
    from gatle_ignite.cli import launch
    from gatle_ignite.launch import launcher

    assert launch is launcher
