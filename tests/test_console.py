"""The console summary on the training's log: a line a summary, and a line of its own for each evaluation."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from evaluated_loop import EvaluatedLoop

from mindwatch.sinks.console import ConsoleSummary, format_evaluation


def test_each_evaluation_is_a_line_on_the_console_and_no_summary_reads_it_as_a_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="mindwatch"), EvaluatedLoop(tmp_path, interval=0.001) as loop:
        loop.train(3)
        loop.eval(loss=0.551234, accuracy=0.812345, eval_time=0.4, samples=512, epoch=1)
        loop.train(3)
        loop.eval(loss=0.4, accuracy=0.9, top5=0.99, eval_time=0.04, epoch=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "mindwatch" and r.getMessage().startswith("mindwatch step")]
    evals = [line for line in lines if " eval | " in line]
    assert evals == [
        "mindwatch step 3 (epoch 1) eval | loss 0.5512 | accuracy 0.8123 | 0.4 s, 512 samples",
        "mindwatch step 6 (epoch 2) eval | loss 0.4 | accuracy 0.9 | top5 0.99 | 40 ms",
    ]
    summaries = [line for line in lines if line not in evals]
    assert summaries, "interval 1 ms: a summary line each batch the worker wrote"
    # every summary is a step's, with its training loss: never an evaluation's record read as a step
    for line in summaries:
        step = int(line.split()[2])
        assert f"| loss {loop.losses[step]:.4f}" in line, (line, loop.losses[step])
    assert "step 6" in summaries[-1]  # the last one, at the end of the run, is the last step's


def test_a_batch_of_evaluations_alone_writes_no_summary(caplog: pytest.LogCaptureFixture) -> None:
    console = ConsoleSummary(interval=0, logger=logging.getLogger("mindwatch.test_console"))
    with caplog.at_level(logging.INFO, logger="mindwatch.test_console"):
        console.write([{"step": 7, "t": 1.0, "rank": 0, "epoch": 2, "loss": 2.5}])
        console.write([{"step": 7, "t": 2.0, "rank": 0, "epoch": 2, "eval/loss": float("nan"), "eval_time": 75.0}])
        console.close("finished")
    assert caplog.messages == [
        "mindwatch step 7 (total unknown) | loss 2.5000",
        "mindwatch step 7 (epoch 2) eval | loss nan | 1m 15s",
        "mindwatch step 7 (total unknown) | loss 2.5000",  # the end: the newest step's summary, not the evaluation's
        "mindwatch: run finished",
    ]


def test_an_evaluation_read_back_from_the_store_reads_the_same() -> None:
    stored = {"step": 120, "t": 1.0, "rank": 0, "epoch": 3.0, "eval/accuracy": 0.81234, "eval/loss": "inf", "eval_samples": 512.0}
    assert format_evaluation(stored) == "step 120 (epoch 3) eval | loss inf | accuracy 0.8123 | 512 samples"
