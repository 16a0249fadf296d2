"""Print an HTML report to PDF with headless Chromium (the same page, the same charts).

Example::

    from mindwatch.report.pdf import html_to_pdf
    html_to_pdf(Path("report.html"), Path("report.pdf"))

Chromium is found at ``$MINDWATCH_CHROMIUM``, then ``chromium``, ``chromium-browser``,
``google-chrome`` on PATH (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str:
    """The Chromium executable, or an error that says how to get one."""
    env = os.environ.get("MINDWATCH_CHROMIUM")
    if env:
        return env
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(
        "--pdf needs Chromium: install it (Debian: apt-get install chromium) or set MINDWATCH_CHROMIUM to its path; "
        "the HTML report was written and can be printed from any browser"
    )


def html_to_pdf(html: Path, pdf: Path, timeout: float = 120.0) -> Path:
    """Render ``html`` to ``pdf`` with headless Chromium and return ``pdf``."""
    chromium = find_chromium()
    pdf = Path(pdf).resolve()
    with tempfile.TemporaryDirectory(prefix="mindwatch-chromium-") as profile:
        cmd = [
            chromium,
            "--headless",
            "--no-sandbox",  # needed as root and in containers; the page is our own file
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--no-pdf-header-footer",
            "--virtual-time-budget=10000",  # let the charts draw before printing
            f"--print-to-pdf={pdf}",
            Path(html).resolve().as_uri() + "#print",  # report.js lays the page out for paper (template.html)
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not pdf.is_file() or pdf.stat().st_size == 0:
        raise RuntimeError(f"Chromium could not print {html} to PDF (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return pdf
