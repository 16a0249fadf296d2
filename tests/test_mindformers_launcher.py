"""The file of ``mindwatch.mindspore.mindformers`` as the script a launcher runs (``python FILE``, msrun's task script),
in front of a MindFormers training: it never hides the ``mindformers`` package, and a file of the user's that does is
named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mindwatch
import mindwatch.mindspore.mindformers as launcher

REPO = Path(__file__).resolve().parent.parent
MF_PYTHON = REPO / ".venv-mindformers" / "bin" / "python"
SCRIPT = REPO / "tests" / "mindformers_scripts" / "train_llama.py"
SEQ = 32  # the script's model: seq_length 32, input_ids of 33 tokens
needs_mindformers = pytest.mark.skipif(not MF_PYTHON.exists(), reason=f"{MF_PYTHON} is missing: run scripts/setup.sh")


def test_path_prints_the_file_a_launcher_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "mindwatch.mindspore.mindformers", "--path"], capture_output=True, text=True)
    assert out.returncode == 0 and Path(out.stdout.strip()) == Path(launcher.__file__).resolve()


def test_register_names_a_file_of_the_users_that_hides_mindformers(tmp_path: Path) -> None:
    (tmp_path / "mindformers.py").write_text("SETTINGS = {}\n")
    (tmp_path / "train.py").write_text("from mindwatch.mindspore.mindformers import register\nregister()\n")
    out = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert f"'import mindformers' found the file {tmp_path / 'mindformers.py'}" in out.stderr
    assert "pip install" not in out.stderr, "the package is not missing: a file hides it"


@pytest.mark.slow  # a MindFormers training: ~10 s
@needs_mindformers
def test_the_file_runs_a_mindformers_launcher_as_python_does(tmp_path: Path) -> None:
    """``python FILE SCRIPT ARGS``, as msrun starts its task script: FILE's folder is first on sys.path, where
    ``mindformers.py`` (FILE itself) hid the package before."""
    save_dir = tmp_path / "out"
    command = [str(MF_PYTHON), launcher.__file__, str(SCRIPT), "--way", "yaml", "--no-register", "--save-dir", str(save_dir)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOG_v": "3"}
    out = subprocess.run([*command, "--steps", "4"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run = mindwatch.open_run(json.loads(out.stdout.strip().splitlines()[-1])["run_dir"])
    assert run.state == "finished" and list(run.series("loss").step) == [1, 2, 3, 4]
    # tokens as trained: the model's seq_length (32), not the input_ids' width (33: one more for the labels' shift)
    samples, tokens = run.series("samples_per_second").value, run.series("tokens_per_second").value
    assert len(tokens) == 4 and np.allclose(tokens, samples * SEQ, rtol=1e-9)
