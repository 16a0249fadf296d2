"""Shared fixtures. Tests train real (small) MindSpore models on CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def artifacts_dir() -> Path:
    """Where tests keep screenshots and reports for a person to look at (git-ignored)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(autouse=True)
def _quiet_mindspore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOG_v", os.environ.get("GLOG_v", "3"))
