"""Device utilization: npu-smi's table parsed, NVML read for the process's GPU, absent tools leave no metric, and a
utilization drop is "fake training". Runs without an accelerator: NVML and npu-smi are stood in for here."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from mindwatch import system
from mindwatch.alerts.rules.throughput_drop import ThroughputDropRule
from mindwatch.system import device_util_sampler, parse_npu_smi

# npu-smi 23.0 on an Atlas 800T A2 (910B): two chips, then the process table
NPU_SMI_910B = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc2                 Version: 23.0.rc2                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.6        40                0    / 0             |
| 0                         | 0000:C1:00.0  | 87          0    / 0          49152/ 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 90.8        39                0    / 0             |
| 0                         | 0000:C2:00.0  | 3           0    / 0          3277 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 41726         | python                   | 46000                   |
+===========================+===============+====================================================+
"""

# npu-smi 21 on a 910A: the memory column is filled, the HBM one too
NPU_SMI_910A = """\
| NPU     Name      | Health       | Power(W)     Temp(C)           Hugepages-Usage(page) |
| Chip              | Bus-Id       | AICore(%)    Memory-Usage(MB)  HBM-Usage(MB)         |
+===================+==============+========================================================+
| 0       910A      | OK           | 68.4         36                0    / 0              |
| 0                 | 0000:C1:00.0 | 45           2282 / 15593      8192 / 32768          |
+===================+==============+========================================================+
"""

# a 310 inference card: no HBM column
NPU_SMI_310 = """\
| NPU     Name      | Health       | Power(W)     Temp(C)                                   |
| Chip    Device    | Bus-Id       | AICore(%)    Memory-Usage(MB)                          |
+===================+==============+========================================================+
| 0       310       | OK           | 12.8         45                                        |
| 0       0         | 0000:05:00.0 | 20           1000 / 8192                               |
"""


def test_npu_smi_tables_give_each_chips_ai_core_and_memory_share() -> None:
    assert parse_npu_smi(NPU_SMI_910B) == [
        {"device_util": 87.0, "device_mem_util": 100 * 49152 / 65536},
        {"device_util": 3.0, "device_mem_util": 100 * 3277 / 65536},
    ]
    assert parse_npu_smi(NPU_SMI_910A) == [{"device_util": 45.0, "device_mem_util": 25.0}]
    assert parse_npu_smi("npu-smi: command failed\n") == []


def test_a_310_without_hbm_reports_its_memory_column() -> None:
    assert parse_npu_smi(NPU_SMI_310) == [{"device_util": 20.0, "device_mem_util": 100 * 1000 / 8192}]


def test_the_npu_sampler_reads_the_visible_device_and_repeats_between_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = []

    def fake_run(args, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(args)
        return types.SimpleNamespace(stdout=NPU_SMI_910B, returncode=0)

    monkeypatch.setattr(system.shutil, "which", lambda name: "/usr/local/bin/npu-smi" if name == "npu-smi" else None)
    monkeypatch.setattr(system.subprocess, "run", fake_run)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1,0")
    sample = device_util_sampler("Ascend", device_id=0)  # the first visible device is the driver's chip 1
    assert sample is not None
    assert sample() == {"device_util": 3.0, "device_mem_util": 100 * 3277 / 65536}
    assert sample() == sample() and len(calls) == 1  # npu-smi runs at most every NPU_SMI_EVERY_SECS
    assert calls[0] == ["npu-smi", "info"]


def test_without_nvml_or_npu_smi_there_is_no_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    monkeypatch.setattr(system.shutil, "which", lambda name: None)
    assert device_util_sampler("GPU") is None
    assert device_util_sampler("Ascend") is None
    assert device_util_sampler("CPU") is None


def test_nvml_reads_the_gpu_this_process_sees_as_device_id(monkeypatch: pytest.MonkeyPatch) -> None:
    handles = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: handles.append(i) or f"gpu{i}",
        nvmlDeviceGetHandleByUUID=lambda u: handles.append(u) or u,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu={"gpu3": 91, "gpu2": 5}[h], memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=30 * 2**30, total=80 * 2**30, free=50 * 2**30),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    sample = device_util_sampler("GPU", device_id=1)
    assert sample is not None and handles == [3]
    assert sample() == {"device_util": 91.0, "device_mem_util": 37.5}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2c")
    assert device_util_sampler("GPU", device_id=0) is not None and handles[-1] == "GPU-8f2c"


def test_device_memory_reads_the_same_gpu_as_utilization(monkeypatch: pytest.MonkeyPatch) -> None:
    """MindSpore's allocator says nothing (as on a GPU whose allocator reports 0): NVML's memory of the GPU this process
    sees as MindSpore's ``device_id`` 1 under ``CUDA_VISIBLE_DEVICES=2,3``, the driver's GPU 3, as utilization reads."""
    pytest.importorskip("mindspore")
    from mindwatch.mindspore import probes

    handles = []
    used = {"gpu3": 30 * 2**30, "gpu1": 70 * 2**30}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: handles.append(i) or f"gpu{i}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=used[h], total=80 * 2**30, free=0),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    context = {"device_target": "GPU", "device_id": 1}
    monkeypatch.setattr(probes.ms, "get_context", lambda key: context[key])
    sample = probes.device_memory_sampler()
    assert sample is not None and handles == [3], "the driver's index of the second visible GPU"
    assert sample() == {"device_mem_gb": 30 * 2**30 / 1e9, "device_mem_peak_gb": 30 * 2**30 / 1e9}


def test_a_utilization_drop_while_the_loss_looks_fine_is_fake_training() -> None:
    util = [90.0] * 40 + [5.0] * 5
    recs = [{"step": i + 1, "samples_per_second": 100.0, "loss": 2.0, "device_util": u} for i, u in enumerate(util)]
    rule = ThroughputDropRule(warmup=20, count=3)
    alerts = [a for r in recs for a in rule.check(r)]
    assert [(a["step"], a["metric"]) for a in alerts] == [(43, "device_util")]
    assert alerts[0]["threshold"] == 45.0 and "device_util fell to 5" in alerts[0]["message"]
    ignored = ThroughputDropRule(warmup=20, count=3, util_metric="")
    assert [a for r in recs for a in ignored.check(r)] == []
