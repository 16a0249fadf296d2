"""A training configured with MindFormers' own monitor_config keys only records what they ask for, on their steps."""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model
from test_callback import GPT, gpt_dataset
from test_layers import MomentSnapshots, WeightSnapshots, assert_moments_recorded, by_layer

import mindwatch
from mindwatch.demo.model import LanguageModelLoss, TinyGPT
from mindwatch.demo.train import set_mode
from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm

#: The section as it stands in a MindFormers YAML: nothing of mindwatch's own.
MINDFORMERS_SECTION = """
monitor_config:
  step_interval: 2
  local_norm_format: log
  optimizer_state_format: log
  weight_state_format: log
"""


@pytest.mark.slow  # ~10 s here
def test_mindformers_keys_alone_record_layer_norms_and_adam_moments_on_their_steps(tmp_path: Path, monkeypatch) -> None:
    """step_interval 2 is layers.every 2: MindFormers' steps 2, 4, 6 and mindwatch's first. The weight norms and
    AdamWeightDecay's moments per layer are numpy's norms of the Parameters; the layers' gradient norms make up the
    step's global one."""
    monkeypatch.chdir(tmp_path)  # save_dir is mindwatch's default, ./monitor_output
    (tmp_path / "monitor.yaml").write_text(MINDFORMERS_SECTION)
    set_mode("graph")
    ms.set_seed(7)
    net = LanguageModelLoss(TinyGPT(GPT))
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-2, weight_decay=0.01)
    cell = TrainOneStepWithGradNorm(net, opt, layer_stats=True)
    moments, weights = MomentSnapshots(opt), WeightSnapshots(net)
    monitor = MonitorCallback(config="monitor.yaml")
    Model(cell).train(1, gpt_dataset(6), callbacks=[moments, weights, monitor], dataset_sink_mode=False)

    run = mindwatch.open_run(monitor.run_dir)
    measured = [1, 2, 4, 6]
    assert_moments_recorded(run, moments, measured)
    layers = sorted(by_layer(weights.before[1]))
    assert "blocks.0.attn.qkv" in layers
    grad_norm = run.series("grad_norm")
    global_at = dict(zip(grad_norm.step.tolist(), grad_norm.value.tolist(), strict=True))
    squares = dict.fromkeys(measured, 0.0)
    for layer in layers:
        w, g = run.series(f"weight_norm/{layer}"), run.series(f"grad_norm/{layer}")
        assert w.step.tolist() == measured and g.step.tolist() == measured, layer
        for step, value in zip(measured, w.value, strict=True):
            assert value == pytest.approx(np.sqrt(by_layer(weights.before[step])[layer]), rel=1e-4), (layer, step)
        for step, value in zip(measured, g.value, strict=True):
            squares[step] += float(value) ** 2
    for step in measured:
        assert np.sqrt(squares[step]) == pytest.approx(global_at[step], rel=1e-4), step
