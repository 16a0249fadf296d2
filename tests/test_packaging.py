"""Where the chart library is found, and the version: what a wheel and a checkout each rely on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

import mindwatch
from mindwatch import assets
from mindwatch.cli import main


def fake_echarts(node_modules: Path) -> Path:
    js = node_modules / "echarts" / "dist" / "echarts.min.js"
    js.parent.mkdir(parents=True)
    js.write_text("/* echarts */")
    return js


def test_an_explicit_node_modules_wins_over_the_copy_in_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "echarts.min.js").write_text("/* packaged */")
    monkeypatch.setattr(assets, "_VENDOR", vendor)
    monkeypatch.delenv("MINDWATCH_NODE_MODULES", raising=False)
    assert assets.echarts_js() == vendor / "echarts.min.js"
    monkeypatch.setenv("MINDWATCH_NODE_MODULES", str(tmp_path / "nm"))
    js = fake_echarts(tmp_path / "nm")
    assert assets.echarts_js() == js


def test_an_explicit_node_modules_without_echarts_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINDWATCH_NODE_MODULES", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"MINDWATCH_NODE_MODULES={tmp_path} holds no echarts"):
        assets.echarts_js()


def test_without_a_packaged_copy_a_checkout_uses_its_node_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINDWATCH_NODE_MODULES", raising=False)
    monkeypatch.setattr(assets, "_VENDOR", tmp_path / "no-vendor")
    monkeypatch.setattr(assets, "_CHECKOUT_NODE_MODULES", tmp_path / "node_modules")
    with pytest.raises(FileNotFoundError, match="run scripts/setup.sh"):
        assets.echarts_js()
    js = fake_echarts(tmp_path / "node_modules")
    assert assets.echarts_js() == js


def test_the_version_is_defined_once_and_printed_by_mindwatch_version(capsys: pytest.CaptureFixture[str]) -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.findall(r"^version\b.*$", pyproject, re.M) == ['version = { attr = "mindwatch.__version__" }']
    assert 'dynamic = ["version"]' in pyproject
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"mindwatch {mindwatch.__version__}\n"
