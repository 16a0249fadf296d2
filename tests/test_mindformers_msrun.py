"""MindFormers under msrun as its users run it: 2 workers in data parallel, MindFormers' own wrapper (the CPU subclass of
``MFTrainOneStepCell``), the file of ``mindwatch.mindspore.mindformers`` as msrun's task script in front of the
launcher (the tests' own, ``mindformers_scripts/train_llama.py``), our callback named in its YAML."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_distributed import Webhooks, base_env, free_port
from test_mindformers_launcher import MF_PYTHON, SCRIPT, needs_mindformers

import mindwatch
import mindwatch.mindspore.mindformers as launcher

pytestmark = [pytest.mark.slow, needs_mindformers]  # each an msrun launch of MindFormers: 20-60 s

_MF_STEP = re.compile(r"step:\[\s*(\d+)/\s*\d+\]")


def msrun_mindformers(tmp_path: Path, *args: str, steps: int, parallel: bool = True, keep_wrapper: bool = False) -> mindwatch.Run:
    """msrun, the file (``--keep-wrapper`` too with ``keep_wrapper``), the launcher and its arguments (data parallel,
    unless not ``parallel``); the run recorded."""
    env = base_env()  # msrun's own variables left out, its retries quicker
    env["PATH"] = f"{MF_PYTHON.parent}{os.pathsep}{env['PATH']}"  # MindFormers' environment: its msrun and python
    msrun = ["msrun", "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}", "--log_dir=logs", "--join=True"]
    script = [str(SCRIPT), "--way", "yaml", "--no-register", "--save-dir", str(tmp_path / "out")]
    script += ["--data-parallel"] if parallel else []
    command = [*msrun, launcher.__file__, *(["--keep-wrapper"] if keep_wrapper else []), *script, "--steps", str(steps), *args]
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, "".join(worker_log(tmp_path, r)[-2000:] for r in (0, 1))
    said = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"run_dir"')]  # among msrun's lines
    return mindwatch.open_run(said[-1]["run_dir"])


def worker_log(tmp_path: Path, rank: int) -> str:
    return (tmp_path / "logs" / f"worker_{rank}.log").read_text(errors="replace")


def mindformers_steps(log: str) -> list[int]:
    """The steps MFLossMonitor printed."""
    return [int(m) for m in _MF_STEP.findall(log)]


def test_the_file_is_msruns_task_script_and_300_clean_steps_raise_nothing_twice(tmp_path: Path) -> None:
    """The file as msrun's task script in front of a data-parallel launch: 300 clean steps, every layer measured every
    10, the alerts to a real local webhook. Both ranks record every step into one run; no alert is judged on a value
    one rank alone has (its own gradient norms, before the all-reduce), and no event (a rule at a step) reaches the
    webhook in two messages."""
    hooks = Webhooks()
    try:
        monitor = {"layers": {"every": 10}, "notify": [{"type": "webhook", "url": hooks.url}]}
        run = msrun_mindformers(tmp_path, "--local-norm", "--monitor", json.dumps(monitor), steps=300)
    finally:
        hooks.close()
    assert run.ranks == [0, 1] and run.meta["world_size"] == 2 and run.state == "finished"
    for rank in (0, 1):
        assert list(run.series("loss", rank=rank).step) == list(range(1, 301)), f"rank {rank} recorded every step"
        assert len(run.series(f"local_grad_norm/{_first_layer(run)}", rank=rank)) == 31  # steps 1, 10, ..., 300
    assert [p.name for p in run.path.parent.iterdir() if not p.name.startswith(".")] == [run.path.name], "one run"
    assert not [a for a in run.alerts if "local" in str(a.get("metric")) or (a["rule"].startswith("layer_") and a["rank"])]
    events: list[tuple[str, int]] = []
    for _, body in hooks.posts:
        if body.get("event") == "alert":
            events.append((body["rule"], body["step"]))
        elif body.get("event") == "alerts":
            events += sorted({(a["rule"], a["step"]) for a in body["alerts"]})
    assert len(events) == len(set(events)), f"one event in two messages: {events}"


def _first_layer(run: mindwatch.Run) -> str:
    return json.loads((run.path / "layers.rank0" / "layers.json").read_text())["layers"][0]


@pytest.mark.parametrize("wrapper", ["ours", "kept"])
def test_a_nan_loss_on_rank_1_stops_both_ranks_at_its_step_with_the_last_healthy_checkpoint(tmp_path: Path, wrapper: str) -> None:
    """Rank 1's loss goes NaN at step 10 (its embeddings inf). The gradient norm every rank shares after the all-reduce is
    NaN at that step, with overflow 1 at a loss scale of 1 (it was taken for a loss-scale overflow and ignored: both ranks
    stopped 19-29 steps late, through files): every rank stops after step 10 and saves step 10's anomaly checkpoint,
    naming CheckpointMonitor's of step 8. With mindwatch's wrapper (``ours``, what the launcher builds) every layer is
    measured every 5 steps: ``grad_norm/<layer>`` is the reduced norm both ranks share, and ``local_grad_norm/<layer>``
    each rank's own, whose squares add up to what MindFormers' own local_norm logged on that rank. With MindFormers'
    wrapper kept (``--keep-wrapper``), the stop and the checkpoint are the same."""
    monitor = {"alerts": {"nonfinite": {"actions": ["checkpoint", "stop"]}}, "layers": {"every": 5}}
    args = ["--inf-at", "10", "--inf-rank", "1", "--save-every", "4", "--local-norm", "--monitor", json.dumps(monitor)]
    run = msrun_mindformers(tmp_path, *args, steps=20, keep_wrapper=wrapper == "kept")
    assert run.state == "stopped"
    for rank in (0, 1):
        assert mindformers_steps(worker_log(tmp_path, rank))[-1] == 10, f"rank {rank} trained on after step 10"
        assert run.series("loss", rank=rank).step.tolist()[-1] == 10
    loss = {rank: run.series("loss", rank=rank) for rank in (0, 1)}
    assert math.isnan(loss[1].value[-1]) and math.isfinite(loss[0].value[-1]), "rank 1's loss went NaN, rank 0's did not"
    # one anomaly, one alert for the run: the NaN norm every rank shares (MFLossMonitor: global_norm nan, overflow True)
    (found,) = [a for a in run.alerts if a["rule"] == "nonfinite"]
    assert (found["step"], found["metric"], found["rank"]) == (10, "grad_norm", 0)
    for rank in (0, 1):
        assert "overflow cond: True, loss_scale: 1.0, global_norm: [nan]" in worker_log(tmp_path, rank)
    saved = {a["rank"]: a for a in run.alerts if a["rule"] == "intervention" and a["actions"] == ["checkpoint"]}
    for rank in (0, 1):
        assert Path(saved[rank]["checkpoint"]).name == f"anomaly_rank{rank}_step10.ckpt"
        healthy = tmp_path / "output" / "checkpoint" / f"rank_{rank}" / f"llama_tiny_rank_{rank}-1_8.ckpt"
        assert healthy.is_file() and Path(tmp_path, saved[rank]["last_healthy_checkpoint"]).resolve() == healthy.resolve()
    layers_json = [json.loads((run.path / f"layers.rank{rank}" / "layers.json").read_text()) for rank in (0, 1)]
    if wrapper == "kept":  # MindFormers' local_norm alone: each rank's own gradient norms
        assert layers_json[0]["stats"] == ["grad_norm"]
        return
    stats = ["grad_norm", "weight_norm", "update_ratio", "adam_m_norm", "adam_v_norm", "local_grad_norm"]
    assert layers_json[0]["stats"] == stats
    names = layers_json[0]["layers"]
    for rank in (0, 1):  # every rank's norm before the all-reduce came in the step's signal, summed with the gradients
        assert run.series("local_grad_norm", rank=rank).step.tolist() == list(range(1, 11))
    for step in (1, 5):
        shared = [[_at(run, f"grad_norm/{layer}", rank, step) for layer in names] for rank in (0, 1)]
        assert shared[0] == shared[1], f"step {step}: the reduced per-layer norms are the same on both ranks"
        local = [np.array([_at(run, f"local_grad_norm/{layer}", rank, step) for layer in names]) for rank in (0, 1)]
        assert not np.allclose(local[0], local[1]), "each rank's own batch: its own gradient norms"
        for rank in (0, 1):
            logged = _local_norms_logged(worker_log(tmp_path, rank))[step - 1]
            assert (local[rank] ** 2).sum() == pytest.approx(logged.sum(), rel=1e-4), f"rank {rank} step {step}"


def _at(run: mindwatch.Run, metric: str, rank: int, step: int) -> float:
    series = run.series(metric, rank=rank)
    return float(series.value[series.step.tolist().index(step)])


def _local_norms_logged(log: str) -> list[np.ndarray]:
    """MindFormers' own ``local_norm`` output as MFLossMonitor logs it (squared sums per parameter), one per step."""
    return [np.array(block.split(), dtype=np.float64) for block in re.findall(r"local_norm:\n\[(.*?)\]", log, re.S)]


def test_a_launch_that_never_calls_init_trains_in_msruns_scheduler_too_which_records_nothing(tmp_path: Path) -> None:
    """MindFormers without use_parallel under msrun: no init(), so msrun's scheduler process runs the whole training too.
    It is no rank of the run: it says so and records nothing (it recorded as a second rank 0, a run of its own)."""
    run = msrun_mindformers(tmp_path, steps=2, parallel=False)
    scheduler = (tmp_path / "logs" / "scheduler.log").read_text(errors="replace")
    assert 2 in mindformers_steps(scheduler), "the scheduler trained"
    assert "is the scheduler of the launch" in scheduler and "mindwatch: recording run" not in scheduler
    assert run.ranks == [0, 1] and [p.name for p in run.path.parent.iterdir() if not p.name.startswith(".")] == [run.path.name]
