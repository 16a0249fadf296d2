"""TensorBoard: TensorBoard's own reader reads back exactly what the run directory holds.

TensorBoard stores scalars as float32, so "exactly" means ``numpy.float32(jsonl_value)``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import mindwatch
from mindwatch.sinks.tensorboard import ALERT_TAG, TensorBoardSink, export_tensorboard
from mindwatch.store.writer import RunWriter

STEPS = 12


def read_events(log_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def assert_events_equal_run(acc: EventAccumulator, run: mindwatch.Run, rank: int = 0) -> None:
    """Every metric of the run, every step, value and wall time, and nothing else."""
    assert sorted(acc.Tags()["scalars"]) == sorted(run.metrics)
    for metric in run.metrics:
        series = run.series(metric, rank)
        events = acc.Scalars(metric)
        assert [e.step for e in events] == list(series.step), metric
        with np.errstate(over="ignore"):  # float32 has no room for 1e300: it is inf there too
            expected = series.value.astype(np.float32)
        np.testing.assert_array_equal(np.array([e.value for e in events], dtype=np.float32), expected, err_msg=metric)
        np.testing.assert_allclose([e.wall_time for e in events], series.t, rtol=0, atol=1e-6, err_msg=metric)


@pytest.fixture(scope="module")
def tb_run(tmp_path_factory: pytest.TempPathFactory) -> mindwatch.Run:
    """A real training (tiny GPT, GRAPH mode) with ``backend: tensorboard`` and a user metric of its own."""
    from mindspore.train import Callback

    from mindwatch.demo.train import DemoSettings, build_training
    from mindwatch.mindspore import MonitorCallback

    save_dir = tmp_path_factory.mktemp("tb")
    model, dataset = build_training(DemoSettings(steps=STEPS, layers=1, d_model=32, heads=2, batch_size=8, seq_length=32))
    config = {
        "project": "tb",
        "save_dir": str(save_dir),
        "backend": "tensorboard",
        "interval": 60,
        "callback": {"params": {"warn_on_value": {"loss": 0.5}}},  # a byte-level LM's loss is above 0.5: alerts
    }
    monitor = MonitorCallback(config)

    class EvalLike(Callback):  # user metrics with a '/' in the name, on some steps
        def on_train_step_end(self, run_context) -> None:
            step = run_context.original_args().cur_step_num
            if step % 4 == 0:
                monitor.log(step, **{"eval/score": 1.0 / step})

    model.train(1, dataset, callbacks=[monitor, EvalLike()], dataset_sink_mode=False)
    return mindwatch.open_run(monitor.run_dir)


def test_live_sink_event_files_equal_the_jsonl(tb_run: mindwatch.Run) -> None:
    assert tb_run.state == "finished"
    assert {"loss", "lr", "grad_norm", "step_time", "eval/score"} <= set(tb_run.metrics)
    assert len(tb_run.series("loss")) == STEPS
    log_dir = tb_run.path / "tensorboard" / "rank0"
    assert any("tfevents" in p.name for p in log_dir.iterdir())
    acc = read_events(log_dir)
    assert_events_equal_run(acc, tb_run)
    # the alert rules' alerts reached the sink too (Monitor -> alert()), one text entry per alerts.jsonl line
    assert tb_run.alerts, "warn_on_value loss: 0.5 should have raised an alert"
    texts = acc.Tensors(ALERT_TAG)
    assert [t.step for t in texts] == [a["step"] for a in tb_run.alerts]
    assert all(a["rule"] in t.tensor_proto.string_val[0].decode() for t, a in zip(texts, tb_run.alerts, strict=True))


def test_export_of_a_recorded_run_equals_the_jsonl(tb_run: mindwatch.Run, tmp_path: Path) -> None:
    out = export_tensorboard(tb_run.path, tmp_path / "tb_export")
    assert out == tmp_path / "tb_export"
    assert_events_equal_run(read_events(out / "rank0"), tb_run)


def test_export_into_the_run_refuses_to_duplicate_then_overwrites(tb_run: mindwatch.Run) -> None:
    with pytest.raises(FileExistsError, match="overwrite"):
        export_tensorboard(tb_run.path)  # the live sink already wrote tensorboard/rank0
    out = export_tensorboard(tb_run.path, overwrite=True)
    assert out == tb_run.path / "tensorboard"
    assert len([p for p in (out / "rank0").iterdir() if "tfevents" in p.name]) == 1
    assert_events_equal_run(read_events(out / "rank0"), tb_run)


def test_alerts_and_non_finite_values_reach_tensorboard(tmp_path: Path) -> None:
    """Alerts become text entries (live and exported); nan/inf stay nan/inf; all ranks get their own folder."""
    run_dir = tmp_path / "run"
    alert = {
        "t": time.time(),
        "step": 3,
        "rank": 1,
        "rule": "loss_nan",
        "metric": "loss",
        "value": "nan",
        "threshold": None,
        "severity": "critical",
        "message": "loss is NaN",
        "actions": ["stop"],
    }
    for rank in (0, 1):
        writer = RunWriter(run_dir, rank)
        sink = TensorBoardSink(writer.layout.tensorboard(rank))
        records = [{"step": s, "t": time.time(), "rank": rank, "loss": float(s + rank)} for s in (1, 2)]
        records.append({"step": 3, "t": time.time(), "rank": rank, "loss": float("nan"), "grad_norm": float("inf"), "lr": 1e300})
        for sink_or_writer in (writer, sink):
            sink_or_writer.write(records)
        if rank == 1:
            writer.append_alert(alert)
            sink.alert(alert)
        for s in (writer, sink):
            s.close("finished")
    run = mindwatch.open_run(run_dir)
    for log_dir in (run_dir / "tensorboard", export_tensorboard(run_dir, tmp_path / "exported")):
        for rank in (0, 1):
            acc = read_events(log_dir / f"rank{rank}")
            assert_events_equal_run(acc, run, rank)
            assert np.isnan(acc.Scalars("loss")[-1].value) and acc.Scalars("grad_norm")[-1].value == np.inf
            assert acc.Scalars("lr")[-1].value == np.inf  # beyond float32: stored as inf
            texts = acc.Tensors(ALERT_TAG) if ALERT_TAG in acc.Tags()["tensors"] else []
            if rank == 0:
                assert texts == []
            else:
                assert [t.step for t in texts] == [3]
                text = texts[0].tensor_proto.string_val[0].decode()
                assert "loss_nan" in text and "loss is NaN" in text and "stop" in text
                assert acc.SummaryMetadata(ALERT_TAG).plugin_data.plugin_name == "text"


def test_evaluations_are_one_point_each_at_their_steps_in_tensorboard(tmp_path: Path) -> None:
    """A loop that evaluates every 4 steps, ``tensorboard: true`` and ``evaluation.perplexity``: TensorBoard's reader
    finds ``eval/loss`` (and the rest) once per evaluation at the step it ran after, with the values handed to
    ``run.eval``; live and exported alike."""
    from evaluated_loop import EvaluatedLoop

    config = {"tensorboard": True, "interval": 60, "evaluation": {"perplexity": True}}
    with EvaluatedLoop(tmp_path, **config) as loop:
        for epoch in (1, 2, 3):
            loop.train(4)
            loop.eval(loss=1.0 / epoch, accuracy=0.5 + epoch / 10, eval_time=0.1 * epoch, samples=64, epoch=epoch)
    run = mindwatch.open_run(loop.run_dir)
    for log_dir in (loop.run_dir / "tensorboard", export_tensorboard(loop.run_dir, tmp_path / "exported")):
        acc = read_events(log_dir / "rank0")
        assert_events_equal_run(acc, run)  # every metric at every step the run directory holds it
        for name in ("eval/loss", "eval/accuracy", "eval/perplexity", "eval_time", "eval_samples"):
            assert [e.step for e in acc.Scalars(name)] == [4, 8, 12], name
        for key, tag in (("loss", "eval/loss"), ("accuracy", "eval/accuracy"), ("eval_time", "eval_time")):
            expected = np.array([e[key] for e in loop.evaluations], dtype=np.float32)
            np.testing.assert_array_equal([e.value for e in acc.Scalars(tag)], expected, err_msg=tag)
        perplexity = np.exp([e["loss"] for e in loop.evaluations]).astype(np.float32)
        np.testing.assert_allclose([e.value for e in acc.Scalars("eval/perplexity")], perplexity, rtol=1e-6)
        assert [e.step for e in acc.Scalars("perplexity")] == list(range(1, 13))  # the training's, every step
        trained = np.exp([loop.losses[s] for s in range(1, 13)]).astype(np.float32)
        np.testing.assert_allclose([e.value for e in acc.Scalars("perplexity")], trained, rtol=1e-6)


def test_export_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no run directory"):
        export_tensorboard(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="metrics.rank"):
        export_tensorboard(tmp_path / "empty")


def test_crc32c_fallback_matches_the_standard_check_value() -> None:
    """The pure-Python CRC-32C (used without the `crc32c` package) and the one in use agree with the standard."""
    from mindwatch.sinks import tensorboard as tb

    assert tb._crc32c_python(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    data = bytes(range(256)) * 3
    assert tb._crc32c(data) == tb._crc32c_python(data)
