"""Build hook: put the npm-installed ECharts (and its licenses) into the wheel and the sdist.

Example::

    npm ci && python -m build          # or: make dist

The chart library comes from ``node_modules`` (``$MINDWATCH_NODE_MODULES`` when set) and is copied to
``mindwatch/assets/vendor/`` in the build tree only; the checkout keeps using ``node_modules`` directly.
An sdist carries the copy, so a wheel built from it needs no npm. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
VENDOR = Path("mindwatch") / "assets" / "vendor"
#: file in the package <- file under node_modules
FILES = {
    "echarts.min.js": "echarts/dist/echarts.min.js",
    "LICENSE-echarts": "echarts/LICENSE",
    "NOTICE-echarts": "echarts/NOTICE",
    "LICENSE-d3": "echarts/licenses/LICENSE-d3",
    "LICENSE-zrender": "zrender/LICENSE",
}


def _sources() -> dict[str, Path]:
    """Where each vendored file comes from: node_modules, or the copy an unpacked sdist already holds."""
    explicit = os.environ.get("MINDWATCH_NODE_MODULES")
    node_modules = Path(explicit) if explicit else HERE / "node_modules"
    if not explicit and not (node_modules / FILES["echarts.min.js"]).is_file() and (HERE / VENDOR / "echarts.min.js").is_file():
        return {name: HERE / VENDOR / name for name in FILES}  # building from an sdist
    missing = [rel for rel in FILES.values() if not (node_modules / rel).is_file()]
    if missing:
        where = f"MINDWATCH_NODE_MODULES={explicit}" if explicit else str(node_modules)
        raise SystemExit(
            f"mindwatch build: ECharts is missing from {where} ({', '.join(missing)}); the wheel would have no "
            "dashboard. Run `npm ci` in the checkout first (needs Node.js/npm), or build with `make dist`."
        )
    return {name: node_modules / rel for name, rel in FILES.items()}


def _copy_vendor(dest_root: Path) -> None:
    dest = dest_root / VENDOR
    dest.mkdir(parents=True, exist_ok=True)
    for name, src in _sources().items():
        if src.resolve() != (dest / name).resolve():
            shutil.copyfile(src, dest / name)


class BuildPyWithAssets(build_py):
    """build_py that also copies ECharts into the built package (not for editable installs: they read node_modules)."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            _copy_vendor(Path(self.build_lib))


class SdistWithAssets(sdist):
    """sdist that also carries ECharts, so `pip install mindwatch-X.tar.gz` needs no npm."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        _copy_vendor(Path(base_dir))


setup(cmdclass={"build_py": BuildPyWithAssets, "sdist": SdistWithAssets})
