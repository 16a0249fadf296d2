"""The metric vocabulary (mindwatch/metrics.py) is the one owner of a metric name: nothing else lists them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from mindwatch import metrics
from mindwatch.config import ConfigError, load_config

PACKAGE = Path(metrics.__file__).resolve().parent
#: Every built-in name: the per-step metrics and the families.
NAMES = frozenset(m.name for m in metrics.STEP_METRICS + metrics.FAMILIES)
#: Files allowed to hold a list of names: the vocabulary, and the demo's own monitor_config (user config).
OWNERS = {PACKAGE / "metrics.py", PACKAGE / "demo" / "run.py"}
_NAME = re.compile(r"(?<![\w-])(" + "|".join(sorted(NAMES, key=len, reverse=True)) + r")(?![\w-])")


def names_in(node: ast.AST) -> list[str]:
    """The built-in names among the string items of a list, tuple or set display (a family counts as ``<name>/``)."""
    items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else []
    values = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    return [v for v in values if v.removesuffix("/") in NAMES]


def test_no_python_module_but_the_vocabulary_lists_built_in_metric_names() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            hits = names_in(node)
            if len(hits) >= 2:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {hits}")  # type: ignore[attr-defined]
    assert not found, "metric names listed outside mindwatch/metrics.py:\n" + "\n".join(found)


def test_the_check_finds_a_list_of_names() -> None:
    tree = ast.parse('SIGNALS = ("loss", "grad_norm")\nRECORD = {"loss": 1.0}\nPREFIX = ["attention_entropy/", "x"]')
    assert [names_in(n) for n in ast.walk(tree) if names_in(n)] == [["loss", "grad_norm"], ["attention_entropy/"]]


def js_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.js") if not p.name.endswith(".min.js"))


#: What may come right before a regex literal (else a ``/`` divides): an operator, an opening bracket, a keyword.
_BEFORE_REGEX = frozenset("(,=:[!&|?{};+-*%<>~^") | {"", "return", "typeof", "case", "in", "of", "delete", "void", "throw", "new"}
_BEFORE_REGEX |= {"else", "do", "yield", "await"}


def js_strings(code: str) -> list[str]:
    """Every string in JavaScript ``code``: quoted with ``'``, ``"`` or a backtick (a template's text, `` ${...} `` a
    space, its expressions scanned too), not in a comment or a regex literal (``/["']/`` holds no quote that opens one)."""
    found: list[str] = []
    _scan(code, 0, found, in_template=False)
    return found


def _scan(code: str, i: int, found: list[str], *, in_template: bool) -> int:
    """Scan code from ``i``; in a template's ``${...}``, up to its closing brace (the index after it is returned)."""
    depth, before = 0, ""  # open braces in a template's expression; the last token
    while i < len(code):
        c = code[i]
        if c.isspace():
            i += 1
        elif code.startswith("//", i):
            i = _after(code, "\n", i)
        elif code.startswith("/*", i):
            i = _after(code, "*/", i + 2)
        elif c in "'\"":
            end = i + 1
            while end < len(code) and code[end] not in (c, "\n"):
                end += 2 if code[end] == "\\" else 1
            found.append(code[i + 1 : end])
            i, before = end + 1, "a literal"
        elif c == "`":
            i, before = _template(code, i + 1, found), "a literal"
        elif c == "/" and before in _BEFORE_REGEX:
            i, before = _regex_end(code, i + 1), "a literal"
        elif c.isalnum() or c in "_$":
            end = i
            while end < len(code) and (code[end].isalnum() or code[end] in "_$"):
                end += 1
            i, before = end, code[i:end]
        else:
            if in_template and c == "}" and depth == 0:
                return i + 1
            depth += (c == "{") - (c == "}")
            i, before = i + 1, c
    return i


def _after(code: str, end: str, i: int) -> int:
    """The index after the first ``end`` from ``i``; the end of ``code`` if there is none."""
    at = code.find(end, i)
    return len(code) if at < 0 else at + len(end)


def _template(code: str, i: int, found: list[str]) -> int:
    text = []
    while i < len(code) and code[i] != "`":
        if code.startswith("${", i):
            text.append(" ")
            i = _scan(code, i + 2, found, in_template=True)
        else:
            text.append(code[i : i + 2] if code[i] == "\\" else code[i])
            i += 2 if code[i] == "\\" else 1
    found.append("".join(text))
    return i + 1


def _regex_end(code: str, i: int) -> int:
    in_class = False
    while i < len(code) and code[i] != "\n" and (in_class or code[i] != "/"):
        in_class = (in_class or code[i] == "[") and code[i] != "]"
        i += 2 if code[i] == "\\" else 1
    return i + 1


def test_no_javascript_file_holds_a_metric_name_in_quotes() -> None:
    assert len(js_files()) >= 10
    found = []
    for path in js_files():
        for text in js_strings(path.read_text()):
            if _NAME.search(text):
                found.append(f"{path.relative_to(PACKAGE)}: {text[:60]!r}")
    assert not found, "metric names in JavaScript (read them from /api/vocabulary):\n" + "\n".join(found)


def test_the_javascript_check_sees_a_name_in_any_quotes() -> None:
    code = """const A = ["lr"]; // "loss" in a comment, /* 'step_time' */ too
const esc = (s) => s.replace(/[&<>"']/g, f), B = 'grad_norm', u = "http://x/loss_scale", half = a / 2 / b;
const C = `${x}/update_ratio/${y ? `mfu` : "z"}`;  // a template within a template's expression
"""
    named = [text for text in js_strings(code) if _NAME.search(text)]
    assert named == ["lr", "grad_norm", "http://x/loss_scale", "mfu", " /update_ratio/ "]
    assert not any(_NAME.search(text) for text in js_strings("const a = 'losses', b = `${loss}`, c = \"my_loss\";"))


def test_what_is_identical_on_every_rank_after_the_gradient_all_reduce() -> None:
    same = {m.name for m in metrics.STEP_METRICS if m.same_on_every_rank}
    assert same == {"lr", "grad_norm", "loss_scale", "overflow", "iteration"}  # and the step's count: every rank's alike
    assert all(m.same_on_every_rank for m in metrics.LAYER_FAMILIES)
    assert not any(metrics.get(n).same_on_every_rank for n in ("loss", "step_time", "data_time"))  # type: ignore[union-attr]


def test_families_and_names_are_looked_up_in_one_place() -> None:
    assert metrics.family_of("attention_max_logit/blocks.0.attn") == ("attention_max_logit", "blocks.0.attn")
    assert metrics.family_of("val/acc") is None and metrics.family_of("grad_norm") is None
    assert metrics.is_layer_metric("update_ratio/blocks.1.mlp") and not metrics.is_layer_metric("attention_entropy/b")
    assert metrics.get("samples_per_second").unit == "1/s"  # type: ignore[union-attr]
    assert metrics.get("my_metric") is None
    grouped = [name for g in metrics.CHART_GROUPS for name in g.metrics]
    charted = [m.name for m in metrics.STEP_METRICS if m.name not in metrics.NOT_CHARTED]
    assert sorted(grouped) == sorted(charted)  # every built-in metric has a card, but a coordinate (iteration)
    assert metrics.get("iteration").group == "" and "iteration" in metrics.vocabulary()["not_charted"]  # type: ignore[union-attr]


def test_the_config_accepts_every_switch_and_alias_of_the_vocabulary() -> None:
    every = sorted(metrics.config_names())
    cfg = load_config({"metrics": every})
    assert cfg.enabled_metrics >= {m.name for m in metrics.STEP_METRICS if m.switch} | {"attention_entropy"}
    assert "iteration" not in metrics.config_names(), "recorded where a rewind sets it apart from step: no switch"
    assert load_config({"metrics": ["attention_max_logit"]}).enabled_metrics == {"attention_entropy"}
    assert "attention_entropy" not in load_config({}).enabled_metrics
    with pytest.raises(ConfigError, match="unknown metric 'los'"):
        load_config({"metrics": ["los"]})


def test_the_dashboard_serves_the_vocabulary(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    with TestClient(create_app(tmp_path)) as c:  # type: ignore[arg-type]
        body = c.get("/api/vocabulary").json()
    assert {k: body[k] for k in metrics.vocabulary()} == metrics.vocabulary()  # beside it: the states' colours
    assert [g["id"] for g in body["groups"]] == [g.id for g in metrics.CHART_GROUPS]
    assert {f["prefix"] for f in body["families"]} == {f"{m.name}/" for m in metrics.FAMILIES}
