"""MindSpore Transformers: a tiny Llama trained by ``mindformers.Trainer`` with our callback.

MindFormers 1.9 needs MindSpore 2.9, so this runs in its own environment, ``.venv-mindformers``
(created by scripts/setup.sh), as a subprocess. What we record must equal what MindFormers'
own ``MFLossMonitor`` printed for the same steps, formatted the way it formats them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mindwatch

REPO = Path(__file__).resolve().parent.parent
MF_PYTHON = REPO / ".venv-mindformers" / "bin" / "python"
SCRIPT = REPO / "tests" / "mindformers_scripts" / "train_llama.py"
STEPS = 6

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not MF_PYTHON.exists(), reason=f"{MF_PYTHON} is missing: run scripts/setup.sh (it creates the MindFormers environment)"
    ),
]

# { Epoch:[  1/  1], step:[    2/    6], loss:[5.542228/5.547224], per_step_time: 23ms, lr: 0.0005,
#   overflow cond: False, loss_scale: 65536.0, global_norm: [1.4221795], train_throughput_per_npu: 0.003T
_MF_LINE = re.compile(
    r"step:\[\s*(?P<step>\d+)/\s*\d+\], loss:\[(?P<loss>[^/\]]+)/[^\]]*\], per_step_time: \d+ms, "
    r"lr: (?P<lr>[^,]+), overflow cond: (?P<overflow>[^,]+), loss_scale: (?P<loss_scale>[^,]+), "
    r"global_norm: (?P<global_norm>.+?)(?:, train_throughput|$)"
)


def _train(
    way: str, workdir: Path, *extra: str, launcher: tuple[str, ...] = (), steps: int = STEPS, ran: int | None = None
) -> tuple[mindwatch.Run, dict[int, dict[str, str]]]:
    """Train (``steps`` an epoch, ``ran`` of them when it stops early); MFLossMonitor's printed lines by their step."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOG_v": "3"}
    script = [str(SCRIPT), "--way", way, "--save-dir", str(workdir / "monitor_output"), "--steps", str(steps)]
    cmd = [str(MF_PYTHON), *launcher, *script]
    proc = subprocess.run([*cmd, *extra], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"MindFormers training failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    printed = {}
    for line in Path(result["log"]).read_text(encoding="utf-8").splitlines():
        m = _MF_LINE.search(line)
        if m:
            printed[int(m["step"])] = m.groupdict()
    assert sorted(printed) == list(range(1, (ran or steps) + 1)), f"MFLossMonitor lines not found in {result['log']}"
    return mindwatch.open_run(result["run_dir"]), printed


def _assert_same_as_mfloss_monitor(run: mindwatch.Run, printed: dict[int, dict[str, str]], clipped: bool) -> None:
    assert run.state == "finished"
    assert run.meta["versions"]["mindspore"].startswith("2.9")
    loss, lr, norm = run.series("loss"), run.series("lr"), run.series("grad_norm")
    assert list(loss.step) == list(range(1, STEPS + 1))
    assert list(lr.step) == list(range(1, STEPS + 1))
    for i, step in enumerate(loss.step):
        mf = printed[int(step)]
        assert f"{loss.value[i]:5.6f}" == mf["loss"], f"step {step}: loss"  # MFLossMonitor's own format
        assert str(np.float32(lr.value[i])) == mf["lr"], f"step {step}: lr"
        assert mf["overflow"] == "False" and run.series("overflow").value[i] == 0.0
    if clipped:
        assert list(norm.step) == list(range(1, STEPS + 1))
        for i, step in enumerate(norm.step):
            assert str(np.array([norm.value[i]], dtype=np.float32)) == printed[int(step)]["global_norm"], (
                f"step {step}: global_norm"
            )
    else:  # MindFormers' train cell returns global_norm None when clipping is off
        assert all(p["global_norm"] == "None" for p in printed.values())
        assert len(norm) == 0
    assert max(lr.value) > 0 and lr.value[0] == 0.0  # warm-up from 0: the lr the step used, not the next one


def test_callback_instance_in_trainer_records_what_mflossmonitor_prints(tmp_path: Path) -> None:
    run, printed = _train("instance", tmp_path)
    _assert_same_as_mfloss_monitor(run, printed, clipped=True)
    assert run.meta["config"]["project"] == "mindformers"
    assert len(run.series("tokens_per_second")) == STEPS


def test_callback_by_name_in_mindformers_yaml(tmp_path: Path) -> None:
    run, printed = _train("yaml", tmp_path)
    _assert_same_as_mfloss_monitor(run, printed, clipped=True)
    # the YAML's inline monitor config reached the callback
    assert run.meta["config"]["interval"] == 1
    assert run.path.parent.name == "mindformers"


def test_launcher_seed_name_config_file_and_no_clipping(tmp_path: Path) -> None:
    """An unedited launcher run through `python -m mindwatch.mindspore.mindformers --keep-wrapper` (MindFormers' own
    wrapper), the article's name, the monitor config as a file path, the 7-item output (local norms); without clipping
    global_norm is absent, not wrong."""
    args = ("--no-register", "--no-clip", "--local-norm", "--name", "MindSporeTransformersMonitor", "--config-as", "path")
    run, printed = _train("yaml", tmp_path, *args, launcher=("-m", "mindwatch.mindspore.mindformers", "--keep-wrapper"))
    # local_norm: the wrapper returned 7 items (MindFormers logs their norm sizes and the per-parameter squared sums)
    log = (tmp_path / "output" / "log" / "rank_0" / "info.log").read_text()
    assert "norm_size:" in log
    _assert_same_as_mfloss_monitor(run, printed, clipped=False)
    # ... recorded per layer as grad_norm/<layer>: its squares add up to what MindFormers logged, step by step
    logged = [np.array(block.split(), dtype=np.float64) for block in re.findall(r"local_norm:\n\[(.*?)\]", log, re.S)]
    layers = [m for m in run.metrics if m.startswith("grad_norm/")]
    assert len(layers) > 3 and len(logged) >= STEPS
    per_step = np.stack([run.series(m).value for m in layers])  # (layers, steps)
    assert run.series(layers[0]).step.tolist() == list(range(1, STEPS + 1))
    for i in range(STEPS):
        assert (per_step[:, i] ** 2).sum() == pytest.approx(logged[i].sum(), rel=1e-4)
    assert (tmp_path / "monitor.yaml").is_file() and run.meta["config"]["interval"] == 1
    # shown only as measured: the layer files hold the gradient norms alone (no weight norm or update ratio of NaNs),
    # so neither the layers view nor TensorBoard nor the report offers what MindFormers' wrapper cannot measure
    head = json.loads((run.path / "layers.rank0" / "layers.json").read_text())
    assert head["stats"] == ["grad_norm"]
    assert not [m for m in run.metrics if m.startswith(("weight_norm/", "update_ratio/"))]


def test_checkpoint_action_names_checkpoint_monitors_last_file_before_the_anomaly(tmp_path: Path) -> None:
    """CheckpointMonitor saves every 4 steps over three epochs of 6; the lr, warming up linearly from 0 over 18 steps
    (step s uses 1e-3 x (s - 1) / 18), first passes 4.7e-4 at step 10: the rule's checkpoint action names the file of
    step 8, the second epoch's step 2 (each step pauses 0.1 s: time for the monitor to act before the training ends)."""
    limit, anomaly, every, per_epoch, epochs = 4.7e-4, 10, 4, 6, 3
    monitor = {
        "callback": {"params": {"warn_on_value": {"lr": {"above": limit}}}},
        "alerts": {"thresholds": {"actions": ["checkpoint"]}},
    }
    args = ("--epochs", str(epochs), "--warmup", str(epochs * per_epoch), "--save-every", str(every), "--pause", "0.1")
    args += ("--monitor", json.dumps(monitor))
    run, _ = _train("yaml", tmp_path, *args, steps=per_epoch)

    assert run.state == "finished"
    lr = run.series("lr")
    assert list(lr.step) == list(range(1, epochs * per_epoch + 1))  # global steps across the epochs
    assert [s for s, v in zip(lr.step, lr.value, strict=True) if v > limit][0] == anomaly
    (cause,) = [a for a in run.alerts if a["rule"] == "threshold"]
    assert cause["step"] == anomaly and cause["metric"] == "lr"
    (done,) = [a for a in run.alerts if a["rule"] == "intervention"]
    assert done["actions"] == ["checkpoint"] and done["cause_step"] == anomaly

    last_save = (anomaly - 1) // every * every  # 8: the last save before the anomaly's step
    epoch, in_epoch = (last_save - 1) // per_epoch + 1, (last_save - 1) % per_epoch + 1
    expected = tmp_path / "output" / "checkpoint" / "rank_0" / f"llama_tiny_rank_0-{epoch}_{in_epoch}.ckpt"
    assert expected.name == "llama_tiny_rank_0-2_2.ckpt" and expected.is_file()
    healthy = done["last_healthy_checkpoint"]
    assert healthy is not None and Path(healthy).resolve() == expected.resolve(), done["message"]
    assert f"last checkpoint saved while healthy: {healthy}" in done["message"]
    assert Path(done["checkpoint"]).is_file()  # mindwatch's own save of the weights at the action's step


@pytest.mark.skipif(importlib.util.find_spec("mindformers") is not None, reason="MindFormers is installed in this environment")
def test_register_says_what_to_install_without_mindformers() -> None:
    # the main environment has MindSpore 2.10 and no MindFormers
    code = "from mindwatch.mindspore.mindformers import register\ntry:\n    register()\nexcept ImportError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "mindformers==1.9.0" in out.stdout, out.stdout + out.stderr


_EVAL_LINE = re.compile(r"_execute_eval: Eval result: (?P<result>\{.*\}), eval time is (?P<secs>[\d.]+) s\.")


def test_do_eval_is_recorded_as_what_mindformers_logs_at_its_step(tmp_path: Path) -> None:
    """MindFormers' ``do_eval`` (its ``EvalCallBack`` only logs the result) every 3 steps: ``eval/loss`` and
    ``eval/PPL`` at steps 3 and 6 are what its own log line prints; the evaluation's time is no step's."""
    run, _ = _train("yaml", tmp_path, "--eval-every", "3")
    logged, results = _mindformers_evaluations(tmp_path)
    assert len(results) == 2, f"MindFormers evaluated twice: {logged}"
    for name in ("loss", "PPL"):
        s = run.series(f"eval/{name}")
        assert s.step.tolist() == [3, 6], name
        assert s.value.tolist() == pytest.approx([r[name] for r in results], rel=1e-9), name
    took = run.series("eval_time")
    assert took.step.tolist() == [3, 6]
    step_time = dict(zip(run.series("step_time").step.tolist(), run.series("step_time").value.tolist(), strict=True))
    assert step_time[4] < float(logged[0]["secs"]) / 2, "the step after the evaluation is timed without it"
    assert run.series("eval_samples").value.tolist() == [4.0, 4.0]  # 2 batches of 2


def _mindformers_evaluations(workdir: Path) -> tuple[list[re.Match[str]], list[dict[str, float]]]:
    """MindFormers' own "Eval result" log lines, and each line's metric values."""
    import ast

    log_file = next((workdir / "output" / "log").glob("rank_0/info.log"))
    logged = [m for line in log_file.read_text().splitlines() if (m := _EVAL_LINE.search(line))]
    return logged, [ast.literal_eval(m["result"])["PerplexityMetric"] for m in logged]


def test_early_stopping_on_do_eval_stops_at_the_step_whose_evaluation_decided_it(tmp_path: Path) -> None:
    """``patience: 1, min_delta: 0.01`` with an evaluation every 3 of 12 steps: the training ends at the step of the
    first evaluation whose loss (as MindFormers logs it) is not 0.01 below the best before it; no step after it runs."""
    monitor = json.dumps({"alerts": {"early_stopping": {"patience": 1, "min_delta": 0.01}}})
    steps = 12
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOG_v": "3"}
    script = [str(SCRIPT), "--way", "yaml", "--save-dir", str(tmp_path / "monitor_output"), "--steps", str(steps)]
    cmd = [str(MF_PYTHON), *script, "--eval-every", "3", "--monitor", monitor]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _, results = _mindformers_evaluations(tmp_path)
    losses = [r["loss"] for r in results]
    stop = next((i for i in range(1, len(losses)) if not losses[i] < min(losses[:i]) - 0.01), None)
    assert stop is not None, f"the held-out loss must stop improving within {steps} steps: {losses}"
    assert len(losses) == stop + 1, "no evaluation after the one that decided"
    run = mindwatch.open_run(json.loads(proc.stdout.strip().splitlines()[-1])["run_dir"])
    assert run.series("loss").step.tolist() == list(range(1, 3 * (stop + 1) + 1)), "no step after the deciding one"
    assert run.state == "stopped" and "early stopping: eval/loss has not improved for 1 evaluation" in run.statuses[0]["reason"]
