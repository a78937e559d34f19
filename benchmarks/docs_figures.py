"""Every measured figure in the docs comes from a result file: the markers, their check.

    python -m benchmarks.docs_figures --check    # exit 1, one line per figure that differs
    python -m benchmarks.docs_figures --write    # rewrite every marked figure from its file

A figure in README.md or docs/*.md is wrapped in two HTML comments, invisible when the
Markdown is rendered::

    <!--fig cpu-2core.json:rows[model=cnn,size=8].project.train_member_images_per_s {:,.0f}-->5,027<!--/fig-->

Opening marker: ``<!--fig FILE:EXPR FORMAT-->``, on one line with its closing
``<!--/fig-->``; the text between them is the figure as the reader sees it. Bold and units
stay outside: ``**<!--fig ...-->0.9730<!--/fig-->** nats``.

- ``FILE``: a result file's name in ``benchmarks/results/`` (JSON). It must hold ``date``
  (ISO, the day it was measured) and ``machine`` (what it ran on): a marker naming a file
  without them is an error, as is a missing file, path or list element.
- ``EXPR``: a path into the JSON, or arithmetic of paths and numbers with ``+ - * /`` and
  parentheses, operators between spaces (``a / b``, ``1000 / a - 1000 / b``). A path is
  dot-separated steps: a key (``"..."`` quotes one that holds dots, spaces or brackets), a
  list index (``rows.0``), or a key with a selector, ``rows[model=cnn,size=8]``: the one
  element of the list ``rows`` whose fields equal those values (compared as text: ``8``
  matches 8 and "8"; ``flag=true``, ``x=null`` as JSON writes them; a dotted field,
  ``rows[project.strategy=unroll]``, looks inside the element). A bare selector step
  ``[k=v]`` searches the list the path has reached; a value with spaces is quoted,
  ``rows[entry="train CLI"]``. ``#`` before a path counts: ``#rows[verdict=clean]`` is the
  number of elements the selector matches, ``#rows`` the list's length.
- ``FORMAT``: a Python format string with one field, applied to the value: ``{:,.0f}``,
  ``{:.4f}``, ``{:.2f}x``, ``{:.0%}`` (default ``{}``), or a named format: ``@minsec``
  (seconds as ``1 min 26 s``; under a minute ``49 s``) or ``@mmss`` (seconds as ``11:34``).

``--check`` also fails on a marker without its closing comment, an unknown format and a
value that cannot be formatted. A marker in inline code or a fenced code block is an
example, not a figure.
``--write`` after a re-measurement rewrites the marked text only; the words around a
figure stay the author's to reread.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"<!--fig (?P<spec>.*?)-->(?P<text>.*?)<!--/fig-->")
OPEN = re.compile(r"<!--fig[ \-]")
REQUIRED_FIELDS = ("date", "machine")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}$")
CODE_SPAN = re.compile(r"`[^`]*`")


class FigureError(ValueError):
    """A marker that cannot be resolved: missing file, path, field, or a bad format."""


def default_docs(root: Path = ROOT) -> list[Path]:
    """The files whose figures are checked: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


# ---------------------------------------------------------------- paths and expressions

STEP = re.compile(r'"(?P<quoted>[^"]*)"|(?P<key>[^.\["]+)|\[(?P<select>[^\]]*)\]|(?P<dot>\.)')


def _steps(path: str) -> list[tuple[str, str]]:
    """``rows[model=cnn].project."a b"`` -> [("key", "rows"), ("select", "model=cnn"), ...]."""
    steps, pos = [], 0
    while pos < len(path):
        m = STEP.match(path, pos)
        if m is None:
            raise FigureError(f"cannot read path {path!r} at {path[pos:]!r}")
        pos = m.end()
        if m["dot"]:
            continue
        if m["select"] is not None:
            steps.append(("select", m["select"]))
        else:
            steps.append(("key", m["quoted"] if m["quoted"] is not None else m["key"]))
    if not steps:
        raise FigureError("empty path")
    return steps


def _join(steps: list[tuple[str, str]]) -> str:
    out = ""
    for kind, step in steps:
        if kind == "select":
            out += f"[{step}]"
        else:
            out += ("." if out else "") + (f'"{step}"' if re.search(r"[.\[\]\s]", step) else step)
    return out


def _as_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _select(node, step: str, path: str) -> list:
    if not isinstance(node, list):
        raise FigureError(f"[{step}] in {path!r}: not a list")
    wanted = {k.strip(): v.strip().strip('"') for k, v in (p.split("=", 1) for p in step.split(",") if "=" in p)}
    if not wanted:
        raise FigureError(f"[{step}] in {path!r}: a selector is field=value[,field=value]")
    return [e for e in node if all(_field(e, k) == v for k, v in wanted.items())]


def _field(element, dotted: str) -> str | None:
    """A selector field's value as text (``project.strategy`` looks inside), or None."""
    for key in dotted.split("."):
        if not isinstance(element, dict) or key not in element:
            return None
        element = element[key]
    return _as_text(element)


def resolve(data, path: str):
    """The value at ``path`` in ``data`` (see the module docstring); FigureError if none.
    ``#path`` counts: the elements its last selector matches, or the length of the list
    (or object) it reaches."""
    if path.startswith("#"):
        steps = _steps(path[1:])
        node = resolve(data, _join(steps[:-1])) if len(steps) > 1 else data
        kind, step = steps[-1]
        if kind == "select":
            return len(_select(node, step, path))
        node = resolve(data, path[1:])
        if not isinstance(node, list | dict):
            raise FigureError(f"{path!r}: only a list or an object has a count")
        return len(node)
    node = data
    for kind, step in _steps(path):
        if kind == "select":
            found = _select(node, step, path)
            if len(found) != 1:
                raise FigureError(f"[{step}] in {path!r}: {len(found)} elements match, not 1")
            node = found[0]
        elif isinstance(node, list):
            if not re.fullmatch(r"-?\d+", step):
                raise FigureError(f"{step!r} in {path!r}: a list needs an index or a [field=value] selector")
            try:
                node = node[int(step)]
            except IndexError:
                raise FigureError(f"index {step} in {path!r}: the list has {len(node)} elements") from None
        elif isinstance(node, dict):
            if step not in node:
                raise FigureError(f"no key {step!r} in {path!r}")
            node = node[step]
        else:
            raise FigureError(f"{step!r} in {path!r}: {type(node).__name__} has no fields")
    return node


TOKEN = re.compile(r'\s*(?:(?P<paren>[()])|(?P<word>(?:"[^"]*"|[^\s()"])+))')
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arith(node, names: dict):
    if isinstance(node, ast.Expression):
        return _arith(node.body, names)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_arith(node.left, names), _arith(node.right, names))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    raise FigureError("an expression is paths and numbers with + - * / and parentheses")


def evaluate(data, expr: str):
    """A path's value, or the arithmetic of paths and numbers in ``expr``."""
    tokens, pos = [], 0
    expr = expr.strip()
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise FigureError(f"cannot read {expr!r} at {expr[pos:]!r}")
        tokens.append(m["paren"] or m["word"])
        pos = m.end()
    if len(tokens) == 1:
        return resolve(data, tokens[0])
    names: dict[str, Any] = {}
    source: list[str] = []
    for tok in tokens:
        if (len(tok) == 1 and tok in "()+-*/") or re.fullmatch(r"\d+(\.\d*)?([eE]-?\d+)?", tok):
            source.append(tok)
        else:
            value = resolve(data, tok)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise FigureError(f"{tok!r} is {value!r}, not a number")
            names[f"_v{len(names)}"] = value
            source.append(f"_v{len(names) - 1}")
    try:
        tree = ast.parse(" ".join(source), mode="eval")
        return _arith(tree, names)
    except SyntaxError:
        raise FigureError(f"cannot read the expression {expr!r}") from None
    except ZeroDivisionError:
        raise FigureError(f"{expr!r} divides by zero") from None


# ---------------------------------------------------------------- formats


def _minsec(seconds: float) -> str:
    total = round(seconds)
    minutes, s = divmod(total, 60)
    return f"{minutes} min {s} s" if minutes else f"{s} s"


def _mmss(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}:{s:02d}"


NAMED = {"@minsec": _minsec, "@mmss": _mmss}


def render(value, fmt: str) -> str:
    """``value`` as ``fmt`` (a Python format string with one field, or a named format)."""
    if fmt.startswith("@"):
        if fmt not in NAMED:
            raise FigureError(f"unknown format {fmt!r} (named formats: {', '.join(NAMED)})")
        return NAMED[fmt](value)
    try:
        return fmt.format(value)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise FigureError(f"format {fmt!r} of {value!r}: {e}") from None


# ---------------------------------------------------------------- markers


@dataclass
class Figure:
    """One marker in a doc file: where it is, what it names, what the doc says."""

    doc: Path
    line: int
    spec: str
    text: str
    start: int  # offsets of ``text`` in the line
    end: int

    def parse(self) -> tuple[str, str, str]:
        """(file, expression, format) of the marker."""
        body = self.spec.strip()
        if ":" not in body.split()[0]:
            raise FigureError("a marker is <!--fig FILE:PATH [FORMAT]-->")
        fmt = "{}"
        m = re.search(r"\s(\{[^}]*\}\S*|\S*\{[^}]*\}\S*|@\w+)$", body)
        if m:
            fmt, body = m.group(1), body[: m.start()]
        file, expr = body.split(":", 1)
        if "/" in file or not file.endswith(".json"):
            raise FigureError(f"{file!r}: a marker names a .json file in benchmarks/results/ by its name")
        return file, expr.strip(), fmt


def find(doc: Path) -> tuple[list[Figure], list[str]]:
    """The markers of ``doc`` and the errors of markers that are not whole. Fenced code
    blocks and inline code spans (examples) are skipped."""
    figures, errors, fenced = [], [], False
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        prose = CODE_SPAN.sub(lambda m: " " * len(m[0]), line)  # same offsets, code spans blank
        matched = list(MARKER.finditer(prose))
        for m in matched:
            figures.append(Figure(doc, n, m["spec"], m["text"], m.start("text"), m.end("text")))
        if len(OPEN.findall(prose)) != len(matched) or prose.count("<!--/fig-->") != len(matched):
            errors.append(f"{doc}:{n}: a <!--fig ...--> marker without its <!--/fig--> on the same line")
    return figures, errors


class Results:
    """The result files, each read once and checked for ``date`` and ``machine``."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._cache: dict[str, object] = {}

    def get(self, name: str):
        if name not in self._cache:
            path = self.directory / name
            if not path.is_file():
                raise FigureError(f"no result file {name} in {self.directory}")
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise FigureError(f"{name} is not JSON: {e}") from None
            missing = [f for f in REQUIRED_FIELDS if not (isinstance(data, dict) and data.get(f))]
            if missing:
                raise FigureError(f"{name} has no {' or '.join(missing)}: every result file says when and where")
            if not DATE.match(str(data["date"])):
                raise FigureError(f"{name}: date {data['date']!r} is not YYYY-MM-DD")
            self._cache[name] = data
        return self._cache[name]

    def value(self, fig: Figure) -> str:
        file, expr, fmt = fig.parse()
        return render(evaluate(self.get(file), expr), fmt)


def check(docs: list[Path], results: Path = RESULTS) -> tuple[list[str], int]:
    """One line per figure whose text differs from its result file or cannot be resolved,
    and the number of markers checked."""
    store, problems, count = Results(results), [], 0
    for doc in docs:
        figures, errors = find(doc)
        problems += errors
        for fig in figures:
            count += 1
            where = f"{doc}:{fig.line}: <!--fig {fig.spec}-->"
            try:
                want = store.value(fig)
            except FigureError as e:
                problems.append(f"{where}: error: {e}")
                continue
            if want != fig.text:
                problems.append(f"{where}: the doc says {fig.text!r}, the result file gives {want!r}")
    return problems, count


def write(docs: list[Path], results: Path = RESULTS) -> tuple[list[str], int]:
    """Rewrite every marked figure from its result file; the errors and the number changed."""
    store, problems, changed = Results(results), [], 0
    for doc in docs:
        figures, errors = find(doc)
        problems += errors
        lines = doc.read_text().splitlines(keepends=True)
        for fig in reversed(figures):  # right to left: earlier offsets on a line stay valid
            try:
                want = store.value(fig)
            except FigureError as e:
                problems.append(f"{doc}:{fig.line}: <!--fig {fig.spec}-->: error: {e}")
                continue
            if want != fig.text:
                line = lines[fig.line - 1]
                lines[fig.line - 1] = line[: fig.start] + want + line[fig.end :]
                changed += 1
        doc.write_text("".join(lines))
    return problems, changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 if a marked figure differs from its result file")
    mode.add_argument("--write", action="store_true", help="rewrite every marked figure from its result file")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the result files' directory")
    parser.add_argument("docs", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    docs = args.docs or default_docs()
    if args.check:
        problems, count = check(docs, args.results)
        for line in problems:
            print(line)
        print(f"{count} figures in {len(docs)} files: {len(problems) or 'no'} problems", file=sys.stderr)
    else:
        problems, count = write(docs, args.results)
        for line in problems:
            print(line)
        print(f"{count} figures rewritten in {len(docs)} files; {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
