"""Write the generated sections of ``docs/`` into the markdown files themselves.

    python scripts/gen_docs.py            # regenerate every section, and the example curves
    python scripts/gen_docs.py --check    # exit 1 naming each file whose sections are stale

A generated section sits between two markers, and everything between them is this script's:

    <!-- gatle:begin config-reference -->
    ...
    <!-- gatle:end -->

To add one, write its one-line marker (``<!-- gatle:config-reference -->``) where it goes and
run the script, which turns it into a section. So a page reads the same in an editor, on a
forge's file view and on the site; ``tests/test_docs.py`` fails when a section is stale, and the
site build (``docs/hooks.py``) refuses to build from stale pages. The kinds:

* ``config-reference``: every config field, its default read from ``base_config()`` and its
  meaning from ``gatle_ignite.config.reference``; ``undeclared-fields``, ``ds-params``,
  ``loss-entry``: the other tables of that module;
* ``contracts``: the entrypoint table ``gatle_ignite.dispatch.CONTRACTS``;
* ``builtin-losses``, ``builtin-metrics``: the built-in losses and metrics (``BUILTINS`` of their
  packages), each with its parameters, read from its signature;
* ``builtin-backends``: ``gatle_ignite.callbacks.logging.BUILTIN_BACKENDS``;
* ``example NAME``: ``examples/NAME/README.md``, with the training curves of every
  ``docs/data/NAME/*.csv`` (drawn into ``docs/assets/curves/NAME/``) after its introduction;
* ``source PATH``: a file of the repository as a code block;
* ``extras``: the optional dependencies of ``pyproject.toml``;
* ``cli-help``: the help of ``gatle-ignite`` and of each sub-command, as the Python that
  generated it formats it (its version is in the marker; another Python does not check it).
"""

import argparse
import csv
import html
import io
import os
import re
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DATA = DOCS / "data"
EXAMPLES = ROOT / "examples"
CURVES = "assets/curves"

# The documented code is the checkout's, even when another copy is installed.
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

_SECTION = re.compile(
    r"<!-- gatle:begin (?P<kind>[a-z-]+)(?: (?P<arg>[^\s>]+))? -->\n"
    r"(?P<body>.*?)"
    r"<!-- gatle:end -->",
    re.DOTALL,
)
_BARE = re.compile(r"<!-- gatle:(?!begin |end )(?P<kind>[a-z-]+)(?: (?P<arg>[^\s>]+))? -->")
_PYTHON = f"python{sys.version_info.major}.{sys.version_info.minor}"

# The config each data file was recorded from, when it is not examples/<ex>/configs/<ex>_v0.py.
_RUN_CONFIGS = {
    ("teacher_student", "teacher_metrics.csv"): "examples/teacher_student/configs/teacher_v0.py",
    ("teacher_student", "metrics.csv"): "examples/teacher_student/configs/teacher_student_v0.py",
}
_RUN_LABELS = {
    ("teacher_student", "teacher_metrics.csv"): "stage 1, the teacher",
    ("teacher_student", "metrics.csv"): "stage 2, the student",
}


class DocsError(Exception):
    """A marker naming nothing, or a reference table out of step with the config."""


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


def examples() -> list:
    """The shipped examples: the folders of ``examples/`` holding a README.md."""
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


def check_field_docs() -> None:
    """Refuse a config field without an entry in FIELD_DOCS, or an entry of no field."""
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
        raise DocsError("gatle_ignite/config/reference.py is out of date: " + "; ".join(problems))


def _config_reference() -> str:
    from gatle_ignite.config.base import OPTIONAL_KNOWN, REQUIRED_FIELDS, base_config
    from gatle_ignite.config.reference import FIELD_DOCS, FIELD_GROUPS

    check_field_docs()
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
    return "\n".join(out)


def _reference_table(name) -> str:
    from gatle_ignite.config import reference

    table, head = {
        "undeclared-fields": (reference.UNDECLARED_FIELD_DOCS, "Field"),
        "ds-params": (reference.DS_PARAMS_DOCS, "Key"),
        "loss-entry": (reference.LOSS_ENTRY_DOCS, "Key"),
    }[name]
    return _mapping_table(table, head)


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
    return "\n".join(out)


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
                raise DocsError(f"{module_file}: {name} is no literal: {error}") from error
    raise DocsError(f"{module_file} defines no {name}")


def _builtin_backends() -> str:
    backends = _module_constant("callbacks/logging.py", "BUILTIN_BACKENDS")
    flags = _module_constant("callbacks/logging.py", "NOT_A_BACKEND")
    names = ", ".join(_code(n) for n in backends)
    return f"Built-in short names: {names}. Flags that are no sink: {', '.join(map(_code, flags))}."


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
    return "\n".join(out)


# ---------------------------------------------------------------- training curves


def _curve_files(example) -> list:
    """The example's recorded histories, its main run (metrics.csv) last."""
    files = sorted((DATA / example).glob("*.csv")) if (DATA / example).is_dir() else []
    return sorted(files, key=lambda path: path.name == "metrics.csv")


def _png(example, csv_path) -> str:
    return f"{CURVES}/{example}/{csv_path.stem}.png"


def _duration(path):
    """Seconds from the first to the last logged value of a metrics.csv, or None."""
    with open(path, newline="", encoding="utf-8") as handle:
        times = [float(row["wall_time"]) for row in csv.DictReader(handle) if row.get("wall_time")]
    return max(times) - min(times) if times else None


def _history(csv_path) -> dict:
    from gatle_ignite.experiments.history import read_history_file

    history = read_history_file(csv_path)
    if not history:
        raise DocsError(f"{csv_path} holds no numeric metric to plot")
    return history


def _config_of(example, csv_name) -> str:
    return _RUN_CONFIGS.get((example, csv_name), f"examples/{example}/configs/{example}_v0.py")


def _score(example, csv_name) -> dict:
    """``{score name: its direction in words}`` of the config the history was recorded with."""
    from gatle_ignite.config.loader import load_config_from_file
    from gatle_ignite.experiments.runs import direction_words

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the configs name the examples' modules
    cfg = load_config_from_file(ROOT / _config_of(example, csv_name))
    name = cfg.get("score_name", None)
    return {name: direction_words(cfg.get("score_factor", 1))} if name else {}


def draw_curves() -> list:
    """Draw every ``docs/data/<example>/*.csv`` as ``gatle-ignite plot`` does, one full-width
    panel per metric, into ``docs/assets/curves/``; returns the files written."""
    from gatle_ignite.cli.plot import draw_histories

    written = []
    for csv_path in sorted(DATA.glob("*/*.csv")):
        example = csv_path.parent.name
        if not (EXAMPLES / example / "README.md").is_file():
            raise DocsError(f"{csv_path} belongs to no example: examples/{example}/ is missing")
        label = _RUN_LABELS.get((example, csv_path.name), example)
        score = _score(example, csv_path.name)
        figure = draw_histories([_history(csv_path)], [label], columns=1, scores=score)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=80, metadata={"Software": None})
        path = DOCS / _png(example, csv_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_bytes() != buffer.getvalue():
            path.write_bytes(buffer.getvalue())
            written.append(path)
    return written


def _per_iteration(name) -> bool:
    """The points logged every log_every iterations, rather than once per epoch."""
    return name.startswith(("train/lr_", "train/grad_norm")) or name == "train/loss"


def _fmt(value) -> str:
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.4e}"


def _at(point) -> str:
    where = f"iteration {point.step}" if point.step is not None else f"epoch {point.epoch}"
    return f"{_fmt(point.value)} ({where})"


def _curves_section(example) -> str:
    files = _curve_files(example)
    if not files:
        return ""
    out = [
        "## Training curves",
        "",
        "Drawn by `scripts/gen_docs.py` from the `metrics.csv` that the `csv` backend wrote "
        "during one full run of the shipped config (2-core CPU, `OMP_NUM_THREADS=1`):",
        "",
    ]
    for csv_path in files:
        name, history = csv_path.name, _history(csv_path)
        config = _config_of(example, name)
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
            f"![Training curves of {example} ({name})](../{_png(example, csv_path)})",
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
        duration = _duration(csv_path)
        if duration is not None:
            out += ["", f"First to last logged value: {duration:.1f} s of wall time."]
        out += ["", f"The data: [`docs/data/{example}/{name}`](../data/{example}/{name}).", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- example pages


def _in_fence(lines, index) -> bool:
    fences = sum(1 for line in lines[:index] if line.lstrip().startswith("```"))
    return fences % 2 == 1


def _example_page(example) -> str:
    readme = EXAMPLES / example / "README.md"
    if not readme.is_file():
        raise DocsError(f"gatle:example names {example!r}, but {readme} does not exist")
    text = readme.read_text(encoding="utf-8").rstrip("\n")
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


# ---------------------------------------------------------------- sources and packaging


def _source(relative) -> str:
    """A file of the repository as a fenced code block, titled with its path."""
    path = (ROOT / relative).resolve()
    if ROOT not in path.parents or not path.is_file():
        raise DocsError(f"gatle:source names {relative!r}, which is no file of the repository")
    language = {".py": "python", ".sh": "bash", ".toml": "toml"}.get(path.suffix, "text")
    text = path.read_text(encoding="utf-8").rstrip("\n")
    return f'```{language} title="{relative}"\n{text}\n```'


def _extras() -> str:
    """The optional dependencies of pyproject.toml, as a table."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib

        extras = tomllib.loads(text)["project"]["optional-dependencies"]
    except ImportError:  # Python < 3.11: the table's simple lines, read by hand
        section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        extras = {}
        for line in section.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and not key.strip().startswith("#"):
                extras[key.strip()] = re.findall(r'"([^"]+)"', value)
    out = ["| Extra | Installs |", "|---|---|"]
    for name, requirements in extras.items():
        out.append(f"| {_code(name)} | {', '.join(_code(r) for r in requirements)} |")
    return "\n".join(out)


def _cli_help() -> str:
    """``gatle-ignite --help`` and each sub-command's help, from the real parser."""
    from gatle_ignite.cli.main import build_parser

    # argparse wraps to the terminal (and may colour it): make the page stable.
    with mock.patch.dict(os.environ, COLUMNS="100", NO_COLOR="1"):
        parser = build_parser()
        out = ["### `gatle-ignite --help`", "", "```text", parser.format_help().rstrip(), "```"]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    help_text = sub.format_help().rstrip()
                    out += ["", f"### `gatle-ignite {name} --help`", "", "```text", help_text]
                    out += ["```"]
    return "\n".join(out)


# ---------------------------------------------------------------- sections


def render(kind: str, arg) -> str:
    """The text of the section ``kind`` (with its argument), without the markers."""
    if kind == "config-reference":
        return _config_reference()
    if kind in ("undeclared-fields", "ds-params", "loss-entry"):
        return _reference_table(kind)
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
    raise DocsError(f"unknown generated section {kind!r}" + (f" ({arg})" if arg else ""))


def _section(kind: str, arg) -> str:
    arg = _PYTHON if kind == "cli-help" else arg
    named = f"{kind} {arg}" if arg else kind
    return f"<!-- gatle:begin {named} -->\n\n{render(kind, arg).strip()}\n\n<!-- gatle:end -->"


def _same_python(kind: str, arg) -> bool:
    """Whether this Python can check the section: the help is as argparse formats it."""
    return kind != "cli-help" or arg == _PYTHON


def regenerated(text: str) -> str:
    """``text`` with each generated section written anew (a one-line marker becomes one); a
    help section generated by another Python is left as it is."""

    def empty(match) -> str:
        named = " ".join(part for part in (match["kind"], match["arg"]) if part)
        return f"<!-- gatle:begin {named} -->\n<!-- gatle:end -->"

    def section(match) -> str:
        kind, arg = match["kind"], match["arg"]
        return _section(kind, arg) if _same_python(kind, arg) else match.group(0)

    return _SECTION.sub(section, _BARE.sub(empty, text))


def pages() -> list:
    """The markdown files of ``docs/`` that hold a generated section or a marker."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        if _SECTION.search(text) or _BARE.search(text):
            found.append(path)
    return found


def stale() -> list:
    """The pages whose sections are not what the code generates now."""
    check_field_docs()
    return [path for path in pages() if regenerated(_read(path)) != _read(path)]


def check_example_pages() -> None:
    """Refuse an example without a page under ``docs/examples/``."""
    written = {p.stem for p in (DOCS / "examples").glob("*.md") if p.stem != "index"}
    missing = sorted(set(examples()) - written)
    if missing:
        raise DocsError(f"examples without a page under docs/examples/: {missing}")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which pages are stale")
    args = parser.parse_args(argv)
    check_example_pages()
    if args.check:
        outdated = stale()
        for path in outdated:
            print(f"stale: {path.relative_to(ROOT)}")
        if outdated:
            print("Run `python scripts/gen_docs.py` to write them anew.")
        return 1 if outdated else 0
    for path in [*draw_curves(), *_write_pages()]:
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


def _write_pages() -> list:
    written = []
    for path in pages():
        text = _read(path)
        new = regenerated(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            written.append(path)
    return written


if __name__ == "__main__":
    sys.exit(main())
