"""System probes: the host's memory (psutil, cgroup files) and the accelerator's utilization (NVML, npu-smi); no MindSpore.

Example::

    from mindwatch.system import device_util_sampler, host_memory_sampler, host_memory_total_gb

    sample = host_memory_sampler()     # the Monitor's worker calls it at each heartbeat
    sample()                           # {"host_rss_gb": 1.23}
    host_memory_total_gb()             # what this process may use: the machine's or its cgroup's limit
    util = device_util_sampler("GPU", device_id=0)   # None where neither NVML nor npu-smi answers
    util() if util else {}             # {"device_util": 87.0, "device_mem_util": 41.5}
    device_name("Ascend", device_id=0) # "910B3" (npu-smi's name column; NVML's "NVIDIA H100 80GB HBM3"); None on CPU

Device memory in use needs the framework's allocator and lives in :mod:`mindwatch.mindspore.probes`;
the adapter passes the device kind and id it trains on to :func:`device_util_sampler`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

#: npu-smi takes a few hundred ms (a subprocess): it runs at most this often, the sampler repeats its last answer between.
NPU_SMI_EVERY_SECS = 10.0


def host_memory_sampler() -> Callable[[], dict[str, float]]:
    """Resident memory of this process, in GB (10^9 bytes)."""
    proc = psutil.Process()

    def sample() -> dict[str, float]:
        return {"host_rss_gb": proc.memory_info().rss / 1e9}

    return sample


def host_memory_total_gb() -> float:
    """Memory this process may use, in GB: the machine's, or the cgroup limit when lower (containers)."""
    total = psutil.virtual_memory().total
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total / 1e9


def host_memory_available_gb() -> float:
    """Host memory available now, in GB (what a copy kept in host memory may take without swapping)."""
    return psutil.virtual_memory().available / 1e9


def device_util_sampler(device: str, device_id: int = 0) -> Callable[[], dict[str, float]] | None:
    """Utilization of the accelerator this process trains on, in percent: ``device_util`` (compute) and
    ``device_mem_util`` (memory used of total). ``device``: MindSpore's device target (``GPU``, ``Ascend``).

    GPU: NVML (``pip install nvidia-ml-py``), the device ``device_id`` of ``CUDA_VISIBLE_DEVICES``.
    Ascend: ``npu-smi info`` where it is installed (AI Core %, HBM used), the device ``device_id``
    of ``ASCEND_RT_VISIBLE_DEVICES``. None where neither is available (CPU, no driver tools).
    """
    if device == "GPU":
        return _nvml_sampler(device_id)
    if device == "Ascend" and shutil.which("npu-smi"):
        return _npu_smi_sampler(_physical_id(device_id, "ASCEND_RT_VISIBLE_DEVICES"))
    return None


def _physical_id(device_id: int, env: str) -> int | str:
    """The driver's index (or UUID) of the ``device_id``-th visible device."""
    visible = [d.strip() for d in os.environ.get(env, "").split(",") if d.strip()]
    if device_id < len(visible):
        return int(visible[device_id]) if visible[device_id].isdigit() else visible[device_id]
    return device_id


def device_name(device: str, device_id: int = 0) -> str | None:
    """The name the driver gives the accelerator this process trains on (looked up in :mod:`mindwatch.device_peaks`):
    NVML's (``NVIDIA A100-SXM4-80GB``) on ``GPU``, ``npu-smi info``'s chip name (``910B3``) on ``Ascend``; None
    where neither answers (CPU, no driver tools). Runs a subprocess on Ascend: call it once, at start."""
    if device == "GPU":
        found = nvml_handle(device_id)
        if found is None:
            return None
        pynvml, handle = found
        try:
            name = pynvml.nvmlDeviceGetName(handle)
        except Exception:  # an old driver without the call: no name
            return None
        return name.decode() if isinstance(name, bytes) else str(name)
    if device == "Ascend" and shutil.which("npu-smi"):
        try:
            out = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=5, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        names = parse_npu_smi_names(out)
        physical = _physical_id(device_id, "ASCEND_RT_VISIBLE_DEVICES")
        return names[physical] if isinstance(physical, int) and 0 <= physical < len(names) else None
    return None


def nvml_handle(device_id: int) -> tuple[Any, Any] | None:
    """``(pynvml, the device's handle)`` for the ``device_id``-th GPU this process sees (``CUDA_VISIBLE_DEVICES`` maps it
    to the driver's index or UUID); None without nvidia-ml-py or a driver. The one NVML lookup: utilization, the
    device's name and the device memory sampler (``mindspore/probes.py``) all read this device."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]

        pynvml.nvmlInit()
        which = _physical_id(device_id, "CUDA_VISIBLE_DEVICES")
        handle = pynvml.nvmlDeviceGetHandleByIndex(which) if isinstance(which, int) else pynvml.nvmlDeviceGetHandleByUUID(which)
    except Exception:  # no nvidia-ml-py, no driver, no such device
        return None
    return pynvml, handle


def _nvml_sampler(device_id: int) -> Callable[[], dict[str, float]] | None:
    found = nvml_handle(device_id)
    if found is None:  # nothing to sample
        return None
    pynvml, handle = found

    def sample() -> dict[str, float]:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {"device_util": float(util.gpu), "device_mem_util": 100.0 * mem.used / mem.total if mem.total else 0.0}

    return sample


def _npu_smi_sampler(physical: int | str) -> Callable[[], dict[str, float]] | None:
    last: dict[str, float] = {}
    ran = -NPU_SMI_EVERY_SECS

    def sample() -> dict[str, float]:
        nonlocal last, ran
        if time.monotonic() - ran >= NPU_SMI_EVERY_SECS:
            ran = time.monotonic()
            out = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=5, check=False).stdout
            chips = parse_npu_smi(out)
            index = physical if isinstance(physical, int) else -1
            last = chips[index] if 0 <= index < len(chips) else {}
        return dict(last)

    return sample


# | 0 (chip) [device, on a 310] | 0000:C1:00.0 (bus id) | 0 (AI Core %)  0 / 0 (memory MB)  3161 / 65536 (HBM MB) |
_NPU_CHIP = re.compile(
    r"^\|\s*\d+(?:\s+\d+)?\s*\|\s*[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*\|\s*"
    r"(?P<aicore>\d+(?:\.\d+)?)\s+(?P<mem_used>\d+)\s*/\s*(?P<mem_total>\d+)"
    r"(?:\s+(?P<hbm_used>\d+)\s*/\s*(?P<hbm_total>\d+))?"
)


def parse_npu_smi(text: str) -> list[dict[str, float]]:
    """Every chip of ``npu-smi info``'s table, in its order: ``device_util`` (AI Core %) and
    ``device_mem_util`` (HBM used of total, or the memory column where a chip has no HBM)."""
    chips: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _NPU_CHIP.match(line.strip())
        if m is None:
            continue
        used, total = (
            (m["hbm_used"], m["hbm_total"]) if m["hbm_total"] and int(m["hbm_total"]) else (m["mem_used"], m["mem_total"])
        )
        chip = {"device_util": float(m["aicore"])}
        if int(total):
            chip["device_mem_util"] = 100.0 * int(used) / int(total)
        chips.append(chip)
    return chips


# | 0 (NPU) 910B3 (name) | OK (health) | ...: a chip's first row; its second row has a bus id where the health is
_NPU_NAME = re.compile(r"^\|\s*\d+\s+(?P<name>[0-9A-Za-z][\w.-]*)\s*\|\s*[A-Za-z]+\s*\|")


def parse_npu_smi_names(text: str) -> list[str]:
    """The name of every chip of ``npu-smi info``'s table, in its order: ``["910B3", "910B3"]``."""
    return [m["name"] for line in text.splitlines() if (m := _NPU_NAME.match(line.strip()))]
