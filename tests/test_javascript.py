"""The dashboard's JavaScript, checked as the Python is: its pure modules' ``node --test`` suite (``tests/js/``) runs on
the server's responses captured afresh from a real run (``tests/js_fixtures.py``), and the committed responses a bare
``node --test`` reads keep the shape the server gives today. eslint and prettier run in ``make lint``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from js_fixtures import capture, shape, train

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "tests" / "js" / "fixtures"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed (scripts/setup.sh)")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The responses of a run trained now."""
    tmp = tmp_path_factory.mktemp("js")
    capture(train(tmp / "runs"), tmp / "fixtures")
    return tmp / "fixtures"


def test_the_committed_responses_have_the_shape_the_server_gives_today(fresh: Path) -> None:
    names = sorted(p.name for p in fresh.glob("*.json"))
    assert names == sorted(p.name for p in COMMITTED.glob("*.json")), "python tests/js_fixtures.py tests/js/fixtures"
    for name in names:
        now, committed = (json.loads((d / name).read_text()) for d in (fresh, COMMITTED))
        assert shape(committed) == shape(now), f"{name}: run `python tests/js_fixtures.py tests/js/fixtures` again"


def test_the_javascript_suite_passes_on_a_real_runs_responses(fresh: Path) -> None:
    env = {**os.environ, "MINDWATCH_JS_FIXTURES": str(fresh)}
    out = subprocess.run(["node", "--test", "tests/js/"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    passed = int(re.search(r"^# pass (\d+)$", out.stdout, re.M).group(1))
    assert passed >= 10 and re.search(r"^# fail 0$", out.stdout, re.M), out.stdout[-2000:]
