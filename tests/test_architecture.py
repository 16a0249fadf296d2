"""The tree keeps the shape docs/architecture.md draws: import contracts, one name per module, one file per rule."""

from __future__ import annotations

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
