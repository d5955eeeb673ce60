"""MkDocs hooks: the parts of the documentation that are generated from the code and the runs.

Markers in the pages are replaced at build time:

* ``<!-- gatle:config-reference -->``: every config field, its default read from
  ``gatle_ignite.base_config()`` and its meaning from ``gatle_ignite.config.reference``;
* ``<!-- gatle:undeclared-fields -->``, ``<!-- gatle:ds-params -->``,
  ``<!-- gatle:loss-entry -->``: the other tables of that module;
* ``<!-- gatle:contracts -->``: the entrypoint table ``gatle_ignite.dispatch.CONTRACTS``;
* ``<!-- gatle:builtin-losses -->``, ``<!-- gatle:builtin-metrics -->``: the built-in losses and
  metrics (``BUILTINS`` of their packages), each with its parameters, read from its signature;
* ``<!-- gatle:builtin-backends -->``: ``gatle_ignite.callbacks.logging.BUILTIN_BACKENDS``;
* ``<!-- gatle:example NAME -->``: ``examples/NAME/README.md``, with the training curves of
  every ``docs/data/NAME/*.csv`` inserted after its introduction;
* ``<!-- gatle:source PATH -->``: a file of the repository as a code block;
* ``<!-- gatle:extras -->``: the optional dependencies of ``pyproject.toml``;
* ``<!-- gatle:cli-help -->``: the help of ``gatle-ignite`` and of each sub-command.

The curves are drawn with matplotlib's Agg backend when the build starts and added to the site
as generated files under ``assets/curves/``; nothing is written into ``docs/``. A marker naming
something that does not exist, or a config field without documentation, fails the build.
"""

import csv
import html
import io
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DATA = DOCS / "data"
EXAMPLES = ROOT / "examples"
CURVES = "assets/curves"

# The documented code is the checkout's, even when another copy is installed.
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

_MARKER = re.compile(r"<!--\s*gatle:([a-z-]+)(?:\s+([^\s>]+))?\s*-->")

# The config each data file was recorded from, when it is not examples/<ex>/configs/<ex>_v0.py.
_RUN_CONFIGS = {
    ("teacher_student", "teacher_metrics.csv"): "examples/teacher_student/configs/teacher_v0.py",
    ("teacher_student", "metrics.csv"): "examples/teacher_student/configs/teacher_student_v0.py",
}
_RUN_LABELS = {
    ("teacher_student", "teacher_metrics.csv"): "stage 1, the teacher",
    ("teacher_student", "metrics.csv"): "stage 2, the student",
}

# Filled by on_files: (example, file name) -> (png path relative to the site root, series).
_CURVES = {}


# ---------------------------------------------------------------- small helpers


def _cell(text) -> str:
    """Text safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _prose(text) -> str:
    """Plain prose for a table cell: no HTML tags, no accidental emphasis."""
    return _cell(html.escape(str(text), quote=False).replace("*", "\\*"))


def _code(text) -> str:
    text = str(text)
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return _cell(f"{fence}{pad}{text}{pad}{fence}")


def _examples() -> list:
    return sorted(p.name for p in EXAMPLES.iterdir() if (p / "README.md").is_file())


# ---------------------------------------------------------------- config reference


def _default(cfg, name):
    """How a field's default reads: its value, or what a placeholder is."""
    from ml_collections import config_dict

    # The raw field, to tell a typed placeholder from a value; ml_collections keeps it here.
    field = getattr(cfg, "_fields", {}).get(name, cfg[name])
    if isinstance(field, config_dict.FieldReference):
        kind = getattr(field, "_field_type", None)
        value = field.get()
        if value is None:
            kind_name = getattr(kind, "__name__", "any")
            kind_name = "any" if kind_name == "object" else kind_name
            return f"{_code('None')} ({kind_name})"
        return _code(repr(value))
    value = cfg[name]
    if isinstance(value, config_dict.ConfigDict):
        value = value.to_dict()
    return _code(repr(value))


def _check_field_docs():
    from gatle_ignite.config.base import OPTIONAL_KNOWN, base_config
    from gatle_ignite.config.reference import FIELD_DOCS, FIELD_GROUPS

    fields = set(base_config().keys()) | set(OPTIONAL_KNOWN)
    missing = sorted(fields - set(FIELD_DOCS))
    stale = sorted(set(FIELD_DOCS) - fields)
    grouped = [name for _title, names in FIELD_GROUPS for name in names]
    twice = sorted({n for n in grouped if grouped.count(n) > 1})
    ungrouped = sorted(set(FIELD_DOCS) - set(grouped))
    unknown = sorted(set(grouped) - set(FIELD_DOCS))
    problems = []
    if missing:
        problems.append(f"config fields without an entry in FIELD_DOCS: {missing}")
    if stale:
        problems.append(f"FIELD_DOCS entries that are no config field: {stale}")
    if twice or ungrouped or unknown:
        problems.append(
            f"FIELD_GROUPS must list every FIELD_DOCS key once (twice: {twice}, "
            f"missing: {ungrouped}, unknown: {unknown})"
        )
    if problems:
        raise PluginError("gatle_ignite/config/reference.py is out of date: " + "; ".join(problems))


def _config_reference() -> str:
    from gatle_ignite.config.base import OPTIONAL_KNOWN, REQUIRED_FIELDS, base_config
    from gatle_ignite.config.reference import FIELD_DOCS, FIELD_GROUPS

    _check_field_docs()
    cfg = base_config()
    out = []
    for title, names in FIELD_GROUPS:
        out += [f"### {title}", "", "| Field | Default | Meaning |", "|---|---|---|"]
        for name in names:
            if name in OPTIONAL_KNOWN:
                default = "not set (optional)"
            else:
                default = _default(cfg, name)
                if name in REQUIRED_FIELDS:
                    default += ", **required**"
            out.append(f"| {_code(name)} | {default} | {_cell(FIELD_DOCS[name])} |")
        out.append("")
    return "\n".join(out)


def _mapping_table(mapping, head) -> str:
    out = [f"| {head} | Meaning |", "|---|---|"]
    out += [f"| {_code(key)} | {_cell(text)} |" for key, text in mapping.items()]
    return "\n".join(out) + "\n"


def _contracts() -> str:
    from gatle_ignite.dispatch import CONTRACTS

    out = [
        "| Config field(s) | Entrypoint | Contract "
        "| Top-level fields `gatle-ignite config` resolves |",
        "|---|---|---|---|",
    ]
    for label, entrypoint, contract, fields in CONTRACTS:
        checked = ", ".join(_code(f) for f in fields) if fields else "nested entries (below)"
        out.append(f"| {_code(label)} | {_code(entrypoint)} | {_prose(contract)} | {checked} |")
    return "\n".join(out) + "\n"


def _module_constant(module_file, name):
    """A literal module constant, read without importing the module (and torch with it)."""
    import ast

    tree = ast.parse((ROOT / "src" / "gatle_ignite" / module_file).read_text(encoding="utf-8"))
    for node in tree.body:
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if any(getattr(t, "id", None) == name for t in targets) and node.value is not None:
            try:
                return ast.literal_eval(node.value)
            except ValueError as error:
                raise PluginError(f"{module_file}: {name} is no literal: {error}") from error
    raise PluginError(f"{module_file} defines no {name}")


def _builtin_backends() -> str:
    BUILTIN_BACKENDS = _module_constant("callbacks/logging.py", "BUILTIN_BACKENDS")
    NOT_A_BACKEND = _module_constant("callbacks/logging.py", "NOT_A_BACKEND")
    names = ", ".join(_code(n) for n in BUILTIN_BACKENDS)
    flags = ", ".join(_code(n) for n in NOT_A_BACKEND)
    return f"Built-in short names: {names}. Flags that are no sink: {flags}.\n"


def _builtins(package: str, entrypoint: str, given: int) -> str:
    """The built-ins of ``package``: each module's path, what it computes (the first paragraph
    of its docstring) and the parameters its entrypoint takes after the framework's ``given``
    positional ones, with where its ``**kwargs`` go."""
    import importlib
    import inspect

    out = ["| Dotted path | What it computes | Parameters |", "|---|---|---|"]
    for path in importlib.import_module(package).BUILTINS:
        module = importlib.import_module(path)
        parameters = list(inspect.signature(getattr(module, entrypoint)).parameters.values())
        shown = [str(p.replace(annotation=inspect.Parameter.empty)) for p in parameters[given:]]
        reached = [target.__name__ for target, _ in getattr(module, "KWARGS_GO_TO", ())]
        where = f": those of {', '.join(reached)}" if reached else ""
        summary = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
        out.append(f"| {_code(path)} | {_prose(summary)} | {_code(', '.join(shown))}{where} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- training curves


def _duration(path):
    """Seconds from the first to the last logged value of a metrics.csv, or None."""
    with open(path, newline="", encoding="utf-8") as handle:
        times = [float(row["wall_time"]) for row in csv.DictReader(handle) if row.get("wall_time")]
    return max(times) - min(times) if times else None


def _draw(history, label) -> bytes:
    """The run's curves as ``gatle-ignite plot`` draws them: one full-width panel per metric."""
    from gatle_ignite.cli.plot import draw_histories

    figure = draw_histories([history], [label], columns=1)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def on_files(files, config):
    _CURVES.clear()
    if not DATA.is_dir():
        return files
    for csv_path in sorted(DATA.glob("*/*.csv")):
        example = csv_path.parent.name
        if not (EXAMPLES / example / "README.md").is_file():
            raise PluginError(f"{csv_path} belongs to no example: examples/{example}/ is missing")
        from gatle_ignite.cli.plot import read_history_file

        history = read_history_file(csv_path)
        if not history:
            raise PluginError(f"{csv_path} holds no numeric metric to plot")
        label = _RUN_LABELS.get((example, csv_path.name), example)
        png = f"{CURVES}/{example}/{csv_path.stem}.png"
        files.append(File.generated(config, png, content=_draw(history, label)))
        _CURVES[(example, csv_path.name)] = (png, history, _duration(csv_path))
    return files


def _per_iteration(name) -> bool:
    """The points logged every log_every iterations, rather than once per epoch."""
    return name.startswith(("train/lr_", "train/grad_norm")) or name == "train/loss"


def _at(point) -> str:
    where = f"iteration {point.step}" if point.step is not None else f"epoch {point.epoch}"
    return f"{_fmt(point.value)} ({where})"


def _fmt(value) -> str:
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.4e}"


def _curves_section(example) -> str:
    runs = sorted((name, entry) for (ex, name), entry in _CURVES.items() if ex == example)
    if not runs:
        return ""
    # metrics.csv, the example's main run, last: the stages recorded before it come first.
    runs.sort(key=lambda run: run[0] == "metrics.csv")
    out = [
        "## Training curves",
        "",
        "Drawn when this site was built, from the `metrics.csv` that the `csv` backend wrote "
        "during one full run of the shipped config (2-core CPU, `OMP_NUM_THREADS=1`):",
        "",
    ]
    for name, (png, history, duration) in runs:
        config = _RUN_CONFIGS.get((example, name), f"examples/{example}/configs/{example}_v0.py")
        label = _RUN_LABELS.get((example, name))
        if label:
            out += [f"### {label[0].upper()}{label[1:]}", ""]
        # The per-iteration points' cadence: the smallest step they were logged at.
        steps = [p.step for n, points in history.items() if _per_iteration(n) for p in points]
        every = f" --override log_every={min(steps)}" if steps and min(steps) != 100 else ""
        out += [
            "```bash",
            f"OMP_NUM_THREADS=1 gatle-ignite train --config={config} \\",
            f"    --override \"logger_name=['text','csv']\"{every}",
            "```",
            "",
            f"![Training curves of {example} ({name})](../{png})",
            "",
            "| Metric | First | Last | Min | Max |",
            "|---|---|---|---|---|",
        ]
        for metric in sorted(history, key=lambda n: (_per_iteration(n), n)):
            points = history[metric]
            values = [p.value for p in points]
            first, last = _at(points[0]), _at(points[-1])
            out.append(
                f"| {_code(metric)} | {first} | {last} | {_fmt(min(values))} | "
                f"{_fmt(max(values))} |"
            )
        if duration is not None:
            out += ["", f"First to last logged value: {duration:.1f} s of wall time."]
        out += ["", f"The data: [`docs/data/{example}/{name}`](../data/{example}/{name}).", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- example pages


def _example_page(example) -> str:
    readme = EXAMPLES / example / "README.md"
    if not readme.is_file():
        raise PluginError(f"gatle:example names {example!r}, but {readme} does not exist")
    text = readme.read_text(encoding="utf-8")
    source = (
        f'!!! info "Source"\n    The code is in `examples/{example}/`; this page includes its '
        f"`README.md`, so the two never disagree. Run every command from the repository root.\n"
    )
    lines = text.split("\n")
    # After the title and the introduction: before the first second-level heading.
    cut = next(
        (i for i, line in enumerate(lines) if line.startswith("## ") and not _in_fence(lines, i)),
        len(lines),
    )
    title_end = 1 if lines and lines[0].startswith("# ") else 0
    head = "\n".join(lines[:title_end])
    intro = "\n".join(lines[title_end:cut])
    rest = "\n".join(lines[cut:])
    return "\n".join([head, "", source, intro, _curves_section(example), rest])


def _in_fence(lines, index) -> bool:
    fences = sum(1 for line in lines[:index] if line.lstrip().startswith("```"))
    return fences % 2 == 1


# ---------------------------------------------------------------- sources and packaging


def _source(relative) -> str:
    """A file of the repository as a fenced code block, titled with its path."""
    path = (ROOT / relative).resolve()
    if ROOT not in path.parents or not path.is_file():
        raise PluginError(f"gatle:source names {relative!r}, which is no file of the repository")
    language = {".py": "python", ".sh": "bash", ".toml": "toml"}.get(path.suffix, "text")
    text = path.read_text(encoding="utf-8").rstrip("\n")
    return f'```{language} title="{relative}"\n{text}\n```\n'


def _extras() -> str:
    """The optional dependencies of pyproject.toml, as a table."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            tomllib = None
    if tomllib is not None:
        extras = tomllib.loads(text)["project"]["optional-dependencies"]
    else:
        section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        extras = {}
        for line in section.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and not key.strip().startswith("#"):
                extras[key.strip()] = re.findall(r'"([^"]+)"', value)
    out = ["| Extra | Installs |", "|---|---|"]
    for name, requirements in extras.items():
        out.append(f"| {_code(name)} | {', '.join(_code(r) for r in requirements)} |")
    return "\n".join(out) + "\n"


def _cli_help() -> str:
    """``gatle-ignite --help`` and each sub-command's help, from the real parser."""
    import argparse
    import os

    from gatle_ignite.cli.main import build_parser

    saved = {name: os.environ.get(name) for name in ("COLUMNS", "NO_COLOR")}
    # argparse wraps to the terminal (and may colour it): make the page stable.
    os.environ.update(COLUMNS="100", NO_COLOR="1")
    try:
        parser = build_parser()
        out = ["### `gatle-ignite --help`", "", "```text", parser.format_help().rstrip(), "```", ""]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    help_text = sub.format_help().rstrip()
                    out += [f"### `gatle-ignite {name} --help`", "", "```text", help_text]
                    out += ["```", ""]
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return "\n".join(out)


# ---------------------------------------------------------------- the hook


def on_page_markdown(markdown, page, config, files):
    from gatle_ignite.config.reference import DS_PARAMS_DOCS, LOSS_ENTRY_DOCS, UNDECLARED_FIELD_DOCS

    def expand(match):
        kind, arg = match.group(1), match.group(2)
        if kind == "config-reference":
            return _config_reference()
        if kind == "undeclared-fields":
            return _mapping_table(UNDECLARED_FIELD_DOCS, "Field")
        if kind == "ds-params":
            return _mapping_table(DS_PARAMS_DOCS, "Key")
        if kind == "loss-entry":
            return _mapping_table(LOSS_ENTRY_DOCS, "Key")
        if kind == "contracts":
            return _contracts()
        if kind == "builtin-backends":
            return _builtin_backends()
        if kind == "builtin-losses":
            return _builtins("gatle_ignite.losses", "Loss", 0)
        if kind == "builtin-metrics":
            return _builtins("gatle_ignite.metrics", "get_metric", 2)
        if kind == "example" and arg:
            return _example_page(arg)
        if kind == "source" and arg:
            return _source(arg)
        if kind == "extras":
            return _extras()
        if kind == "cli-help":
            return _cli_help()
        raise PluginError(f"{page.file.src_uri}: unknown marker {match.group(0)!r}")

    return _MARKER.sub(expand, markdown)


def on_pre_build(config):
    """Fail at once when the reference or the example pages are out of date."""
    _check_field_docs()
    pages = {p.stem for p in (DOCS / "examples").glob("*.md") if p.stem != "index"}
    missing = sorted(set(_examples()) - pages)
    if missing:
        raise PluginError(f"examples without a page under docs/examples/: {missing}")
