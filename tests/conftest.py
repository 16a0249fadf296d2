"""Shared fixtures. Tests train real (small) MindSpore models on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture
def artifacts_dir() -> Path:
    """Where tests keep screenshots and reports for a person to look at (git-ignored)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
