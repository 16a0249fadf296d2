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
#: The adapter files issue 23 rewrites; they switch to the vocabulary there (see docs/architecture.md).
PENDING: set[Path] = set()
_STRING = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_NAME = re.compile(r"(?<![\w-])(" + "|".join(sorted(NAMES, key=len, reverse=True)) + r")(?![\w-])")


def names_in(node: ast.AST) -> list[str]:
    """The built-in names among the string items of a list, tuple or set display (a family counts as ``<name>/``)."""
    items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else []
    values = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    return [v for v in values if v.removesuffix("/") in NAMES]


def test_no_python_module_but_the_vocabulary_lists_built_in_metric_names() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in OWNERS or path in PENDING:
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


def test_no_javascript_file_holds_a_metric_name_in_quotes() -> None:
    assert len(js_files()) >= 10
    found = []
    for path in js_files():
        code = _COMMENT.sub("", path.read_text())
        for literal in _STRING.findall(code):
            if _NAME.search(literal[1:-1].replace("${", " ")):
                found.append(f"{path.relative_to(PACKAGE)}: {literal[:60]}")
    assert not found, "metric names in JavaScript (read them from /api/vocabulary):\n" + "\n".join(found)


def test_the_javascript_check_sees_a_name() -> None:
    code = _COMMENT.sub("", 'const A = ["lr"]; // "loss" in a comment\nconst B = `${x}/grad_norm/`;')
    assert [lit for lit in _STRING.findall(code) if _NAME.search(lit[1:-1])] == ['"lr"', "`${x}/grad_norm/`"]


def test_what_is_identical_on_every_rank_after_the_gradient_all_reduce() -> None:
    same = {m.name for m in metrics.STEP_METRICS if m.same_on_every_rank}
    assert same == {"lr", "grad_norm", "loss_scale", "overflow"}
    assert all(m.same_on_every_rank for m in metrics.LAYER_FAMILIES)
    assert not any(metrics.get(n).same_on_every_rank for n in ("loss", "step_time", "data_time"))  # type: ignore[union-attr]


def test_families_and_names_are_looked_up_in_one_place() -> None:
    assert metrics.family_of("attention_max_logit/blocks.0.attn") == ("attention_max_logit", "blocks.0.attn")
    assert metrics.family_of("val/acc") is None and metrics.family_of("grad_norm") is None
    assert metrics.is_layer_metric("update_ratio/blocks.1.mlp") and not metrics.is_layer_metric("attention_entropy/b")
    assert metrics.get("samples_per_second").unit == "1/s"  # type: ignore[union-attr]
    assert metrics.get("my_metric") is None
    grouped = [name for g in metrics.CHART_GROUPS for name in g.metrics]
    assert sorted(grouped) == sorted(m.name for m in metrics.STEP_METRICS)  # every built-in metric has a card


def test_the_config_accepts_every_switch_and_alias_of_the_vocabulary() -> None:
    every = sorted(metrics.config_names())
    cfg = load_config({"metrics": every})
    assert cfg.enabled_metrics >= {m.name for m in metrics.STEP_METRICS} | {"attention_entropy"}
    assert load_config({"metrics": ["attention_max_logit"]}).enabled_metrics == {"attention_entropy"}
    assert "attention_entropy" not in load_config({}).enabled_metrics
    with pytest.raises(ConfigError, match="unknown metric 'los'"):
        load_config({"metrics": ["los"]})


def test_the_dashboard_serves_the_vocabulary(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app

    with TestClient(create_app(tmp_path)) as c:  # type: ignore[arg-type]
        body = c.get("/api/vocabulary").json()
    assert body == metrics.vocabulary()
    assert [g["id"] for g in body["groups"]] == [g.id for g in metrics.CHART_GROUPS]
    assert {f["prefix"] for f in body["families"]} == {f"{m.name}/" for m in metrics.FAMILIES}
