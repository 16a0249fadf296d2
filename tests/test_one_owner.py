"""One owner per meaning, as mindwatch/metrics.py is for metric names (tests/test_metrics.py): a state's sentence
(analysis/state_text.py), a state's colour (analysis/state_colours.py), a summary field's label (analysis/summary.py),
a run's tags (analysis/tags.py), a duration's text (units.py, and assets/charts.js for the pages), the launcher's
environment (launch_env.py). Each test scans the package for the meaning written anywhere else, and a view test checks
that every view shows what the owner says."""

from __future__ import annotations

import ast
import io
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from starlette.testclient import TestClient
from test_metrics import js_strings

from mindwatch import metrics
from mindwatch.analysis.state_colours import SEVERITY_COLOURS, STATE_COLOURS, severity_style, state_css, terminal_style
from mindwatch.analysis.summary import LABELS, RunSummary, field_label
from mindwatch.checks.listing import COLUMN_LABELS, SUMMARY_COLUMNS, run_columns
from mindwatch.report.html import render_report
from mindwatch.serve.app import create_app
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.reader import open_run
from mindwatch.store.states import FINAL_STATES, LOST, PRECEDENCE
from mindwatch.store.writer import RunWriter
from mindwatch.terminal.runs import print_runs

PACKAGE = Path(metrics.__file__).resolve().parent
STATES = frozenset((*PRECEDENCE, *FINAL_STATES, LOST))
#: Modules that still say a state (or a summary field) in their own words while they move to the owners: none now.
PENDING: set[Path] = set()
#: A sentence about a run's (or a rank's) state: a state, a death or an end at a step; a rank gone.
_SENTENCE = re.compile(
    r"\b(died|ended|finished|failed|stopped|stalled|stale|lost|running)\b[^.]{0,60}\bat step\b|\bis gone\b", re.I
)
#: A page's colour rule of one state: ``.state-failed``, ``.banner-stale``, ``.banner.running``.
_STATE_RULE = re.compile(r"\.(state|banner)[-.](" + "|".join(sorted(STATES)) + r")\b")
#: A severity's colour written down: a page's rule that colours ``.sev-<severity>``, or a colour keyed by a severity.
_SEVERITY_COLOUR = re.compile(
    r"\.sev-\w+[^{}]*\{[^}]*\bcolor\s*:(?!\s*var\(--sev-)"  # a page's rule
    r"|[\"']?\b(error|warning|info)[\"']?\s*:\s*"  # a map: a severity, then
    r"[\"'](#[0-9a-fA-F]{3,6}|(bold )?(red|yellow|cyan)\b)"  # a colour
)
#: Code that reads a tags value's shape (a list or a mapping).
_TAGS_SHAPE_PY = re.compile(r"isinstance\(\s*[\w.]*tags\b")
_TAGS_SHAPE_JS = re.compile(r"(Array\.isArray|Object\.(entries|keys|values))\(\s*[\w.]*tags\b")
#: Seconds cut into minutes, hours or days.
_CLOCK_PY = re.compile(r"divmod\([^)]*\b(60|3600)\)|(?<![\w.])(/|//|%)\s*(60|3600|86400)\b")
_CLOCK_JS = re.compile(r"(/|%)\s*(60|3600|86400)\b")
#: The variables launchers set: msrun's, a dynamic cluster's, torchrun's.
_LAUNCH_ENV = re.compile(r"[\"'](LOCAL_RANK|DEVICE_ID|RANK_ID|RANK|RANK_SIZE|WORLD_SIZE|MS_ROLE|MS_WORKER_NUM|MS_NODE_ID)[\"']")


def py_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def js_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.js") if not p.name.endswith(".min.js"))


def py_texts(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every string of a module but its docstrings: ``(line, text)``, an f-string's ``{...}`` as ``{}``."""
    docs = set()
    for node in ast.walk(tree):
        scope = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, scope) and node.body and isinstance(node.body[0], ast.Expr):
            docs.add(id(node.body[0].value))
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs | parts:
            yield node.lineno, node.value


def state_dicts(tree: ast.AST) -> Iterator[int]:
    """The lines of dict displays keyed by two or more run states (a sentence or a colour per state)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if len(keys & STATES) >= 2:
                yield node.lineno


def _hits(owners: set[Path], found: Iterator[tuple[Path, str]]) -> tuple[list[str], set[Path]]:
    """What ``found`` holds outside ``owners`` and :data:`PENDING`, and which pending files still hold any."""
    outside, pending = [], set()
    for path, what in found:
        if path in owners:
            continue
        if path in PENDING:
            pending.add(path)
        else:
            outside.append(f"{path.relative_to(PACKAGE)}: {what}")
    return outside, pending


# -- a state in words: analysis/state_text.py ------------------------------------------------------------------------
def test_no_module_but_state_text_puts_a_state_in_words() -> None:
    def found() -> Iterator[tuple[Path, str]]:
        for path in py_files():
            tree = ast.parse(path.read_text(), str(path))
            yield from ((path, f"{line}: {text[:70]!r}") for line, text in py_texts(tree) if _SENTENCE.search(text))
            yield from ((path, f"{line}: a dict keyed by states") for line in state_dicts(tree))
        for path in js_files():
            yield from ((path, repr(text[:70])) for text in js_strings(path.read_text()) if _SENTENCE.search(text))

    owners = {PACKAGE / "analysis" / "state_text.py", PACKAGE / "analysis" / "state_colours.py"}
    outside, pending = _hits(owners, found())
    assert not outside, "a state put in words outside analysis/state_text.py:\n" + "\n".join(outside)
    assert pending == PENDING, f"no longer pending (take it out of PENDING): {sorted(map(str, PENDING - pending))}"


def test_the_sentence_check_sees_a_sentence() -> None:
    code = 'A = f"run ended: {s} at step {n}"\nB = {"failed": "x", "stale": "y"}\nC = "loss at step 3"\n'
    tree = ast.parse(code)
    assert [text for _, text in py_texts(tree) if _SENTENCE.search(text)] == ["run ended: {} at step {}"]
    assert list(state_dicts(tree)) == [2]
    assert _SENTENCE.search("rank 3 is gone (pid 7 exited; last step 12)")


# -- a state's colour: analysis/state_colours.py ---------------------------------------------------------------------
def test_no_page_holds_a_states_colour() -> None:
    pages = [p for p in PACKAGE.rglob("*") if p.suffix in (".css", ".html", ".js") and not p.name.endswith(".min.js")]
    assert len(pages) >= 10
    found = [f"{p.relative_to(PACKAGE)}: {m.group()}" for p in pages for m in _STATE_RULE.finditer(p.read_text())]
    assert not found, "a state's colour outside analysis/state_colours.py (the pages get state_css):\n" + "\n".join(found)


def test_the_dashboard_the_report_and_the_terminal_colour_a_state_alike(tmp_path: Path) -> None:
    assert set(STATE_COLOURS) == STATES
    run_dir = write_run(tmp_path / "logs" / "p" / "one", state="failed")
    with TestClient(create_app(tmp_path / "logs")) as c:  # type: ignore[arg-type]
        served = c.get("/api/vocabulary").json()["state_css"]
    page = render_report([open_run(run_dir)])
    assert served == state_css() and state_css() in page
    assert '<div class="banner banner-failed">' in page and '<span class="state state-failed">failed</span>' in page
    for state, colour in STATE_COLOURS.items():
        assert f".state-{state} {{ background: {colour.strong}; }}" in served
        assert terminal_style(state) == f"bold {colour.strong}"


# -- a severity's colour: analysis/state_colours.py ------------------------------------------------------------------
def test_no_file_but_state_colours_holds_a_severitys_colour() -> None:
    files = [p for p in PACKAGE.rglob("*") if p.suffix in (".css", ".html", ".js", ".py") and not p.name.endswith(".min.js")]
    owner = PACKAGE / "analysis" / "state_colours.py"
    found = [
        f"{p.relative_to(PACKAGE)}: {m.group()}" for p in files if p != owner for m in _SEVERITY_COLOUR.finditer(p.read_text())
    ]
    assert not found, "a severity's colour outside analysis/state_colours.py:\n" + "\n".join(found)
    seen = [m.group() for m in _SEVERITY_COLOUR.finditer('.alert-list .sev-error { color: #8a1c2b; }\nS = {error: "#c62828"}')]
    assert len(seen) == 2, "the check sees a page's rule and a script's map"


def test_the_dashboard_the_report_and_the_terminal_colour_a_severity_alike(tmp_path: Path) -> None:
    assert set(SEVERITY_COLOURS) == {"info", "warning", "error"}
    run_dir = write_run(tmp_path / "logs" / "p" / "one", state="failed")
    with TestClient(create_app(tmp_path / "logs")) as c:  # type: ignore[arg-type]
        served = c.get("/api/vocabulary").json()["state_css"]
    page = render_report([open_run(run_dir)])
    for severity, colour in SEVERITY_COLOURS.items():
        assert f"--sev-{severity}: {colour};" in served and f".sev-{severity} {{ color: var(--sev-{severity}); }}" in served
        assert severity_style(severity) == f"bold {colour}"
    assert served in page


# -- a summary field's label: analysis/summary.py --------------------------------------------------------------------
def test_no_module_but_summary_names_a_summary_field() -> None:
    labels = {text for text in LABELS.values() if not re.fullmatch(r"\w+", text)}  # a plain word is too common to look for

    def found() -> Iterator[tuple[Path, str]]:
        for path in py_files():
            for line, text in py_texts(ast.parse(path.read_text(), str(path))):
                if any(text.strip() == label or text.startswith(f"{label} ") for label in labels):  # a label, or a line it heads
                    yield path, f"{line}: {text[:70]!r}"
        for path in js_files():
            yield from ((path, repr(text)) for text in js_strings(path.read_text()) if text.strip() in labels)

    outside, pending = _hits({PACKAGE / "analysis" / "summary.py"}, found())
    assert not outside, "a summary field's label outside analysis/summary.py's LABELS:\n" + "\n".join(outside)
    assert pending <= PENDING


def test_every_view_names_a_summary_field_as_the_summary_does(tmp_path: Path) -> None:
    fields = {f.name for f in RunSummary.__dataclass_fields__.values()} | {"duration", "rank_text"}
    assert set(LABELS) <= fields and set(SUMMARY_COLUMNS.values()) <= fields  # the runs filter's columns are fields
    run_dir = write_run(tmp_path / "logs" / "p" / "one")
    with TestClient(create_app(tmp_path / "logs")) as c:  # type: ignore[arg-type]
        runs = c.get("/api/runs").json()
        compare = c.get("/api/compare/runs", params={"runs": "p/one"}).json()
    assert runs["labels"] == {**{c: field_label(f) for c, f in SUMMARY_COLUMNS.items()}, "tags": "tags"}
    assert compare["labels"] == {f: field_label(f) for f in fields}
    assert run_columns(runs["runs"][0])["steps"] == runs["runs"][0]["last_step"] == 3  # a column reads its field
    page = render_report([open_run(run_dir)])
    for name in ("best_loss", "max_grad_norm", "last_step", "first_nonfinite_loss_step", "data_wait_share"):
        assert f'<tr data-key="{field_label(name)}"><th>{field_label(name)}</th>' in page
    assert f'data-key="{field_label("samples_per_second_p50")} / p5"' in page
    head = terminal_runs(tmp_path / "logs").splitlines()[2]
    assert re.findall(r"[^\s┃│]+", head) == ["project", "run", "state", "steps", "ETA", "duration", "started", "alerts", "tags"]
    assert [COLUMN_LABELS[c] for c in ("run", "steps", "alerts", "started_at")] == ["run", "steps", "alerts", "started"]


# -- a run's tags: analysis/tags.py ----------------------------------------------------------------------------------
def test_no_module_but_tags_reads_the_tags_shape() -> None:
    found = [f"{p.relative_to(PACKAGE)}: {m.group()}" for p in py_files() for m in _TAGS_SHAPE_PY.finditer(p.read_text())]
    found = [f for f in found if not f.startswith("analysis/tags.py")]
    found += [f"{p.relative_to(PACKAGE)}: {m.group()}" for p in js_files() for m in _TAGS_SHAPE_JS.finditer(p.read_text())]
    assert not found, "tags read outside analysis/tags.py (the pages get tag_texts):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("tags", "texts"), [({"mode": "graph", "seed": 1}, ["mode=graph", "seed=1"]), (["baseline", "fp16"], ["baseline", "fp16"])]
)
def test_every_view_shows_the_tags_alike(tmp_path: Path, tags: object, texts: list[str]) -> None:
    run_dir = write_run(tmp_path / "logs" / "p" / "one", tags=tags)
    with TestClient(create_app(tmp_path / "logs")) as c:  # type: ignore[arg-type]
        row = c.get("/api/runs").json()["runs"][0]
        info = c.get("/api/run", params={"run": "p/one"}).json()
    assert row["tag_texts"] == info["tag_texts"] == texts and row["tags"] == info["tags"] == tags
    page = render_report([open_run(run_dir)])
    assert "".join(f'<span class="tag">{t}</span>' for t in texts) in page
    assert ", ".join(texts) in terminal_runs(tmp_path / "logs")
    columns = run_columns(row)
    assert all(columns[f"tag.{t.split('=')[0]}"] == (t.split("=")[1] if "=" in t else True) for t in texts if "seed" not in t)


# -- a duration in words: units.py, and assets/charts.js for the pages -----------------------------------------------
def test_no_module_but_units_and_charts_js_cut_seconds_into_minutes() -> None:
    found = [
        f"{p.relative_to(PACKAGE)}: {m.group()}"
        for p in py_files()
        if p.name != "units.py"
        for m in _CLOCK_PY.finditer(p.read_text())
    ]
    found += [
        f"{p.relative_to(PACKAGE)}: {m.group()}"
        for p in js_files()
        if p.name != "charts.js"
        for m in _CLOCK_JS.finditer(p.read_text())
    ]
    assert not found, "a duration formatted outside units.format_duration and charts.js's formatDuration:\n" + "\n".join(found)


# -- the launcher's environment: launch_env.py -----------------------------------------------------------------------
def test_no_module_but_launch_env_reads_the_launchers_environment() -> None:
    pending = PACKAGE / "mindspore" / "ranks.py"  # the adapter's rank discovery: its environment moves to launch_env.py
    found = [
        f"{p.relative_to(PACKAGE)}: {m.group()}"
        for p in py_files()
        if p not in (PACKAGE / "launch_env.py", pending)
        for m in _LAUNCH_ENV.finditer(p.read_text())
    ]
    assert not found, "the launcher's environment read outside mindwatch/launch_env.py:\n" + "\n".join(found)


# -- helpers ---------------------------------------------------------------------------------------------------------
def write_run(run_dir: Path, *, state: str = "finished", tags: object = None) -> Path:
    """A one-rank run of 3 steps that ended in ``state`` (``failed``: with an error)."""
    run_dir.mkdir(parents=True)
    t = time.time() - 60
    meta = {"run_id": run_dir.name, "project": run_dir.parent.name, "world_size": 1, "started_at": t, "tags": tags or []}
    write_json_atomic(run_dir / "meta.json", meta)
    w = RunWriter(run_dir, rank=0)
    w.write(
        [{"step": i, "t": t + i, "rank": 0, "loss": 3.0 - i, "grad_norm": 1.0 + i, "samples_per_second": 10.0} for i in (1, 2, 3)]
    )
    w.close(state, error="RuntimeError: out of memory" if state == "failed" else None)
    return run_dir


def terminal_runs(logdir: Path) -> str:
    """What ``mindwatch runs`` prints, as plain text."""
    out = io.StringIO()
    print_runs(logdir, console=Console(file=out, width=200, color_system=None))
    return out.getvalue()
