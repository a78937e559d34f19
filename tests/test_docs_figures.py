"""The docs' measured figures equal their result files (benchmarks/docs_figures.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks import docs_figures as df

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _markers(doc: Path) -> list[df.Figure]:
    figures, errors = df.find(doc)
    assert not errors
    return figures


def test_repository_docs_match_their_result_files():
    problems, count = df.check(df.default_docs(ROOT))
    assert not problems, "\n".join(problems)
    assert count >= 100  # the README and docs are marked, not an empty pass
    assert _markers(README), "README.md has no marked figures"


def test_every_named_result_file_says_when_and_where():
    names = {fig.parse()[0] for doc in df.default_docs(ROOT) for fig in _markers(doc)}
    assert names
    for name in sorted(names):
        data = json.loads((df.RESULTS / name).read_text())
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", data.get("date", "")), name
        assert data.get("machine"), name


def test_a_readme_figure_edited_by_hand_fails(tmp_path):
    fig = next(f for f in _markers(README) if re.search(r"\d", f.text))
    edited = re.sub(r"\d", lambda m: str((int(m[0]) + 1) % 10), fig.text, count=1)
    lines = README.read_text().splitlines(keepends=True)
    line = lines[fig.line - 1]
    lines[fig.line - 1] = line[: fig.start] + edited + line[fig.end :]
    doc = tmp_path / "README.md"
    doc.write_text("".join(lines))

    problems, _ = df.check([doc])
    assert len(problems) == 1
    assert f"README.md:{fig.line}:" in problems[0] and fig.spec in problems[0]
    assert repr(edited) in problems[0] and repr(fig.text) in problems[0]
    assert df.main(["--check", str(doc)]) == 1

    assert df.write([doc]) == ([], 1)  # --write puts the result file's value back
    assert doc.read_text() == README.read_text()


def _set(data, path: str, value) -> None:
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in parents:
        data = data[key]
    data[last] = value


def test_a_changed_result_file_fails(tmp_path):
    fig = next(
        f
        for f in _markers(README)
        if re.fullmatch(r"[\w.]+", f.parse()[1])
        and isinstance(df.resolve(json.loads((df.RESULTS / f.parse()[0]).read_text()), f.parse()[1]), float)
    )
    name, path, _ = fig.parse()
    results = tmp_path / "results"
    shutil.copytree(df.RESULTS, results)
    data = json.loads((results / name).read_text())
    _set(data, path, df.resolve(data, path) * 3 + 7)
    (results / name).write_text(json.dumps(data))

    problems, _ = df.check([README], results)
    assert any(f"README.md:{fig.line}:" in p and fig.spec in p for p in problems), problems
    assert df.main(["--check", "--results", str(results), str(README)]) == 1


@pytest.mark.parametrize(
    ("marker", "error"),
    [
        ("<!--fig no-such-file.json:a.b-->1<!--/fig-->", "no result file no-such-file.json"),
        ("<!--fig r.json:timing.no_such_key-->1<!--/fig-->", "no key 'no_such_key'"),
        ("<!--fig r.json:rows[model=mlp].x-->1<!--/fig-->", "0 elements match"),
        ("<!--fig r.json:rows.5.x-->1<!--/fig-->", "index 5"),
        ("<!--fig r.json:timing.s {:.1f}-->1.0", "without its <!--/fig-->"),
        ("<!--fig r.json:timing.s @hours-->1<!--/fig-->", "unknown format"),
        ("<!--fig undated.json:timing.s-->2.5<!--/fig-->", "has no date"),
    ],
)
def test_a_marker_that_resolves_to_nothing_is_an_error(tmp_path, marker, error):
    results = tmp_path / "results"
    results.mkdir()
    body = {"timing": {"s": 2.5}, "rows": [{"model": "cnn", "x": 1}]}
    (results / "r.json").write_text(json.dumps({"date": "2026-11-25", "machine": {"cpus": 2}, **body}))
    (results / "undated.json").write_text(json.dumps({"machine": "2 cores", **body}))
    doc = tmp_path / "doc.md"
    doc.write_text(f"# t\n\nmeasured: {marker} s\n")

    problems, _ = df.check([doc], results)
    assert len(problems) == 1 and error in problems[0] and f"{doc}:3:" in problems[0], problems


def test_syntax(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    data = {
        "date": "2026-11-25",
        "machine": "2 cores",
        "wall": 86.2,
        "rows": [{"model": "cnn", "size": 8, "a": 5027.1, "b": 2337.0}, {"model": "mlp", "size": 8, "a": 1.0}],
        "runs": {"G=1 one process": {"s": 15.16}},
    }
    (results / "r.json").write_text(json.dumps(data))
    cases = {
        "r.json:wall @minsec": "1 min 26 s",
        "r.json:wall @mmss": "1:26",
        "r.json:rows[model=cnn,size=8].a {:,.0f}": "5,027",
        "r.json:rows[model=cnn,size=8].a / rows[model=cnn,size=8].b {:.2f}x": "2.15x",
        "r.json:(rows.0.a - rows.0.b) / rows.0.a {:.0%}": "54%",
        'r.json:runs."G=1 one process".s {:.1f}': "15.2",
        "r.json:date": "2026-11-25",
    }
    doc = tmp_path / "doc.md"
    examples = "an example, not a figure: `<!--fig nope.json:x-->1<!--/fig-->`\n```\n<!--fig nope.json:x-->1\n```\n"
    doc.write_text(examples + "".join(f"| **<!--fig {spec}-->{text}<!--/fig-->** |\n" for spec, text in cases.items()))
    assert df.check([doc], results) == ([], len(cases))
