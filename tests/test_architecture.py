"""The tree keeps the shape docs/architecture.md draws: import contracts, one name per module, one file per rule."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from mindwatch.alerts.registry import rule_specs
from mindwatch.config import load_config

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(root)}
    )


def test_the_import_contracts_hold_for_the_tree():
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("store/layout.py", "import mindspore", "Only the MindSpore adapter and the demo import MindSpore"),
        ("store/reader.py", "from mindwatch.serve import app", "The store and the config import nothing above them"),
        ("report/pdf.py", "from mindwatch.serve import views", "The dashboard and the report never import each other"),
        ("alerts/engine.py", "from mindwatch.mindspore import callback", "The monitor engine and the alert rules never import"),
        ("metrics.py", "from mindwatch.store import layout", "The metric vocabulary imports nothing of mindwatch"),
        ("mindspore/loop.py", "from mindwatch.mindspore import callback", "The two front doors never import each other"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    shutil.copytree(REPO / "mindwatch", tmp_path / "mindwatch", ignore=shutil.ignore_patterns("__pycache__", "vendor"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "mindwatch" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    done = _lint(tmp_path)
    assert done.returncode != 0
    broken = done.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, done.stdout


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in (REPO / "mindwatch").rglob("*.py") if p.name != "__init__.py")
    assert [n for n, c in names.items() if c > 1] == []


def test_every_rule_module_declares_a_spec_and_gets_a_config_section():
    modules = {p.stem for p in (REPO / "mindwatch" / "alerts" / "rules").glob("*.py")} - {"__init__", "base"}
    specs = rule_specs()
    assert len(specs) == len(modules)
    alerts = load_config({}).alerts
    for spec in specs:
        assert isinstance(getattr(alerts, spec.key), spec.settings), spec.key
        assert spec.doc


def _section(title: str) -> str:
    """The text of docs/architecture.md under ``## <title>``, up to the next section."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    return doc.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_map_names_every_module_of_the_package():
    the_parts = _section("The parts")
    modules = sorted(p for p in (REPO / "mindwatch").rglob("*.py") if p.name != "__init__.py" and "vendor" not in p.parts)
    assert len(modules) > 90 and any(p.parent.name == "rules" for p in modules) and any(p.parent.name == "demo" for p in modules)
    missing = [str(p.relative_to(REPO)) for p in modules if not re.search(rf"(?<!\w){re.escape(p.name)}(?!\w)", the_parts)]
    assert missing == [], "docs/architecture.md's map (## The parts) does not name these modules:\n" + "\n".join(missing)


def test_the_nevers_list_what_the_rules_import():
    nevers = " ".join(_section("The nevers (checked by `lint-imports`)").split())
    listed = nevers.split("which import only", 1)[1].split("and never the config", 1)[0]
    rules = REPO / "mindwatch" / "alerts" / "rules"
    graph = import_graph([REPO / "mindwatch"])
    imported = {m for p in rules.glob("*.py") for m in graph[_module_name(p, REPO)]} - {"mindwatch"}
    outside = sorted(m.removeprefix("mindwatch.") for m in imported if not m.startswith("mindwatch.alerts.rules"))
    assert outside and [m for m in outside if f"`{m}`" not in listed] == [], listed


def _module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(roots: list[Path], base: Path = REPO) -> dict[str, set[str]]:
    """Module -> the repository modules it imports anywhere in its file (``if TYPE_CHECKING:`` and functions included)."""
    files = {_module_name(p, base): p for root in roots for p in root.rglob("*.py") if "__pycache__" not in p.parts}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(m for a in node.names if (m := known(a.name)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                out.update(m for a in node.names if (m := known(f"{base}.{a.name}")))
        graph[module] = out - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (strongly connected, size > 1)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                found.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_a_module_that_imports_it():
    assert cycles(import_graph([REPO / "mindwatch", REPO / "bench"])) == []


def test_the_cycle_check_sees_an_import_under_type_checking(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n")
    (pkg / "c.py").write_text("def f():\n    from . import a\n")
    assert cycles(import_graph([pkg], base=tmp_path)) == [["pkg.a", "pkg.b", "pkg.c"]]
    (pkg / "c.py").write_text("def f():\n    return 1\n")
    assert cycles(import_graph([pkg], base=tmp_path)) == []
