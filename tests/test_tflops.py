"""TFLOPS per device and MFU on real small trainings (CPU): 6 x parameters x tokens over the recorded step time, the
config's FLOPs per step and peak, the known devices' peaks by their drivers' names, the console line and the report."""

from __future__ import annotations

import html as html_lib
import logging
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import dense_training
from mindspore import nn
from mindspore.train import Model
from test_callback import BATCH, GPT, SEQ, gpt_dataset
from test_device_util import NPU_SMI_310, NPU_SMI_910A, NPU_SMI_910B
from test_loop import TutorialLoop

import mindwatch
import mindwatch.mindspore as mw
from mindwatch import system
from mindwatch.cli import main
from mindwatch.demo.model import LanguageModelLoss, TinyGPT
from mindwatch.demo.train import set_mode
from mindwatch.device_peaks import peak_tflops
from mindwatch.system import device_name, parse_npu_smi_names

PEAK = 0.02  # TFLOPS: a CPU-sized peak, so the MFU of the tiny model is a readable number


def parameter_count(net: nn.Cell) -> int:
    """The trainable weights' element count, from the arrays themselves."""
    return sum(int(p.asnumpy().size) for p in net.trainable_params())


def summary_row(report: str, key: str) -> str:
    m = re.search(rf'<tr data-key="{re.escape(key)}"><th>[^<]*</th><td class="num">(.*?)</td>', report)
    assert m, f"no summary row {key!r}"
    return html_lib.unescape(m.group(1))


def test_a_loop_records_6_x_parameters_x_tokens_over_the_step_time_and_mfu_against_the_configured_peak(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loop = TutorialLoop("pynative")
    params = parameter_count(loop.net)
    throughput = {"peak_tflops": PEAK, "baseline": 50.0}
    config = {"save_dir": str(tmp_path), "project": "p", "interval": 60, "throughput": throughput}
    with (
        caplog.at_level(logging.INFO, "mindwatch"),
        mw.start_run(config, network=loop.net, optimizer=loop.optimizer, total_steps=8) as run,
    ):
        for ids, targets in run.batches(gpt_dataset(8).create_tuple_iterator()):
            run.step(*loop.train_step(ids, targets))
    r = mindwatch.open_run(run.run_dir)
    step_time, tflops, mfu = (r.series(m) for m in ("step_time", "tflops", "mfu"))
    assert tflops.step.tolist() == step_time.step.tolist() == list(range(1, 9))
    np.testing.assert_allclose(tflops.value, 6 * params * BATCH * SEQ / step_time.value / 1e12, rtol=1e-9)
    np.testing.assert_allclose(mfu.value, 100 * tflops.value / PEAK, rtol=1e-9)
    linearity = r.series("throughput_linearity")  # the samples per second over one device's alone
    np.testing.assert_allclose(linearity.value, BATCH / step_time.value / 50.0, rtol=1e-9)
    assert r.meta["throughput"] == {
        "flops": "6 x parameters x tokens per step",
        "flops_per_step": None,
        "parameters": params,
        "device": None,  # a CPU has no name to look up
        "peak_tflops": PEAK,
        "peak_source": "throughput.peak_tflops",
    }
    # the console's last line shows the last step's
    last = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("mindwatch step")][-1]
    assert f"| TFLOPS {tflops.value[-1]:.4g} | MFU {mfu.value[-1]:.1f} % |" in last, last

    # the report's summary: the medians over the steps after the first (it compiles)
    out = tmp_path / "report.html"
    assert main(["report", str(run.run_dir), "-o", str(out)]) == 0
    report = out.read_text()
    assert float(summary_row(report, "TFLOPS per device p50")) == pytest.approx(np.median(tflops.value[1:]), rel=5e-4)
    assert float(summary_row(report, "MFU p50").removesuffix(" %")) == pytest.approx(np.median(mfu.value[1:]), rel=5e-4)


def test_model_train_on_a_cpu_records_tflops_and_no_mfu(tmp_path: Path) -> None:
    set_mode("pynative")
    net = LanguageModelLoss(TinyGPT(GPT))
    params = parameter_count(net)
    model = Model(mw.TrainOneStepWithGradNorm(net, nn.SGD(net.trainable_params(), learning_rate=0.05)))
    cb = mw.MonitorCallback({"save_dir": str(tmp_path), "interval": 60})
    model.train(1, gpt_dataset(6), callbacks=[cb], dataset_sink_mode=False)
    r = mindwatch.open_run(cb.run_dir)
    step_time, tflops = r.series("step_time"), r.series("tflops")
    assert len(tflops) == 6
    np.testing.assert_allclose(tflops.value, 6 * params * BATCH * SEQ / step_time.value / 1e12, rtol=1e-9)
    assert "mfu" not in r.metrics  # no peak known for a CPU: no made-up utilization
    assert r.meta["throughput"]["parameters"] == params and r.meta["throughput"]["peak_tflops"] is None


def test_a_model_without_token_ids_has_tflops_only_from_the_configured_flops_per_step(tmp_path: Path) -> None:
    model, data = dense_training(6)
    plain = mw.MonitorCallback({"save_dir": str(tmp_path), "project": "plain", "interval": 60})
    model.train(1, data, callbacks=[plain], dataset_sink_mode=False)
    assert "tflops" not in mindwatch.open_run(plain.run_dir).metrics  # float features: no token count, no guess

    flops = 3.0e9
    model, data = dense_training(6)
    given = mw.MonitorCallback({"save_dir": str(tmp_path), "project": "given", "throughput": {"flops_per_step": flops}})
    model.train(1, data, callbacks=[given], dataset_sink_mode=False)
    r = mindwatch.open_run(given.run_dir)
    np.testing.assert_allclose(r.series("tflops").value, flops / r.series("step_time").value / 1e12, rtol=1e-9)
    assert r.meta["throughput"]["flops"] == "throughput.flops_per_step" and r.meta["throughput"]["parameters"] is None


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        # as NVML's nvmlDeviceGetName prints them
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA A800-SXM4-80GB", 312.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H800", 989.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L40", 181.0),
        ("Tesla V100-SXM2-32GB", 125.0),
        ("Tesla V100-PCIE-16GB", 112.0),
        ("NVIDIA GeForce RTX 4090", 165.0),
        # as npu-smi info's name column prints them
        ("910B1", 414.0),
        ("910B2", 376.0),
        ("910B3", 313.0),
        ("910B4", 280.0),
        ("910A", 256.0),
        ("Ascend910B3", 313.0),
        # unknown: no MFU rather than a wrong one
        ("NVIDIA A10G", None),
        ("910B", None),
        ("310", None),
        ("NVIDIA H20", None),
        ("", None),
    ],
)
def test_the_known_devices_peak_by_the_name_the_driver_prints(name: str, peak: float | None) -> None:
    assert peak_tflops(name) == peak


def test_npu_smi_names_each_chip_in_its_order(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_npu_smi_names(NPU_SMI_910B) == ["910B3", "910B3"]
    assert parse_npu_smi_names(NPU_SMI_910A) == ["910A"]
    assert parse_npu_smi_names(NPU_SMI_310) == ["310"]
    # no Ascend driver here: npu-smi is stood in for, as in test_device_util
    monkeypatch.setattr(system.shutil, "which", lambda name: "/usr/local/bin/npu-smi" if name == "npu-smi" else None)
    monkeypatch.setattr(system.subprocess, "run", lambda args, **kw: types.SimpleNamespace(stdout=NPU_SMI_910B, returncode=0))
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1")
    assert device_name("Ascend", 0) == "910B3"
    assert device_name("CPU", 0) is None


def test_nvml_names_the_gpu_this_process_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    # no GPU here: NVML is stood in for (a real one is not reachable from this machine)
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"gpu{i}",
        nvmlDeviceGetName=lambda h: {"gpu3": b"NVIDIA H100 80GB HBM3"}[h],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert device_name("GPU", 1) == "NVIDIA H100 80GB HBM3"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no nvidia-ml-py
    assert device_name("GPU", 0) is None


def test_a_network_whose_parameters_cannot_be_counted_is_recorded_without_tflops(tmp_path: Path) -> None:
    """A network whose ``trainable_params`` fails (and no optimizer): no TFLOPS, a warning, and the run records."""

    class Odd(nn.Cell):
        def trainable_params(self, recurse: bool = True) -> list:
            raise RuntimeError("this network cannot list its parameters")

    run = mw.start_run({"save_dir": str(tmp_path), "project": "p"}, network=Odd(), optimizer=None)
    assert run.recorder is not None, "monitoring must not stop over TFLOPS"
    for step in range(1, 4):
        run.step(loss=1.0 / step, tokens_per_step=64)
    run.finish()
    r = mindwatch.open_run(run.run_dir)
    assert r.state == "finished" and r.series("loss").step.tolist() == [1, 2, 3]
    assert "tflops" not in r.metrics
