"""The peak TFLOPS of known accelerators, by the name their driver prints: the denominator of MFU.

Example::

    from mindwatch.device_peaks import peak_tflops

    peak_tflops("NVIDIA H100 80GB HBM3")     # 989.0 (NVML's name of an H100 SXM)
    peak_tflops("910B3")                     # 313.0 (npu-smi info's name column; "Ascend910B3" too)
    peak_tflops("Intel Xeon")                # None: unknown, so no MFU (set throughput.peak_tflops)

Each peak is the dense (no 2:4 sparsity) bf16/fp16 matrix throughput, in 10^12 FLOP/s: what mixed-precision
training can reach at best, and the figure MFU is quoted against. A name matches the first pattern it contains
(case-insensitive), so a variant comes before its family. The adapter looks the name up once at start
(:func:`mindwatch.system.device_name`); ``throughput.peak_tflops`` in the config wins over this table.
"""

from __future__ import annotations

import re

#: (pattern, peak TFLOPS, where the number comes from), most specific first.
KNOWN_DEVICES: tuple[tuple[str, float, str], ...] = (
    # NVIDIA's datasheets give Hopper's and Ada's Tensor Core figures "with sparsity": the dense peak is one half
    (r"\bH100\b.*\bPCIE\b", 756.0, "NVIDIA H100 datasheet: bf16 1,513 TFLOPS with sparsity (PCIe)"),
    (r"\bH100\b.*\bNVL\b", 835.0, "NVIDIA H100 datasheet: bf16 1,671 TFLOPS with sparsity (NVL)"),
    (r"\bH100\b", 989.0, "NVIDIA H100 datasheet: bf16 1,979 TFLOPS with sparsity (SXM)"),
    (r"\bH800\b.*\bPCIE\b", 756.0, "the H100 PCIe's Tensor Cores (the H800 differs in NVLink bandwidth only)"),
    (r"\bH800\b", 989.0, "the H100 SXM's Tensor Cores (the H800 differs in NVLink bandwidth only)"),
    (r"\bH200\b.*\bNVL\b", 835.0, "NVIDIA H200 datasheet: bf16 1,671 TFLOPS with sparsity (NVL)"),
    (r"\bH200\b", 989.0, "NVIDIA H200 datasheet: bf16 1,979 TFLOPS with sparsity (SXM)"),
    (r"\bA100\b", 312.0, "NVIDIA A100 datasheet: bf16 Tensor Core 312 TFLOPS (SXM and PCIe)"),
    (r"\bA800\b", 312.0, "the A100's Tensor Cores (the A800 differs in NVLink bandwidth only)"),
    (r"\bL40S\b", 362.0, "NVIDIA L40S datasheet: bf16 733 TFLOPS with sparsity"),
    (r"\bL40\b", 181.0, "NVIDIA L40 datasheet: bf16 362 TFLOPS with sparsity"),
    (r"\bA10\b", 125.0, "NVIDIA A10 datasheet: bf16 Tensor Core 125 TFLOPS"),
    (r"\bV100S\b", 130.0, "NVIDIA V100S datasheet: fp16 Tensor Core 130 TFLOPS (no bf16 on Volta)"),
    (r"\bV100\b.*\bPCIE\b", 112.0, "NVIDIA V100 datasheet: fp16 Tensor Core 112 TFLOPS (PCIe)"),
    (r"\bV100\b", 125.0, "NVIDIA V100 datasheet: fp16 Tensor Core 125 TFLOPS (SXM2)"),
    (r"\bT4\b", 65.0, "NVIDIA T4 datasheet: fp16 Tensor Core 65 TFLOPS"),
    (r"\bRTX 4090\b", 165.0, "NVIDIA Ada whitepaper, RTX 4090: fp16/bf16 with fp32 accumulate 165.2 TFLOPS"),
    (r"\bRTX 3090\b", 71.0, "NVIDIA GA102 whitepaper, RTX 3090: fp16/bf16 with fp32 accumulate 71 TFLOPS"),
    # Huawei publishes no per-variant figure for the 910B: these are the fp16 peaks quoted for each variant
    (r"(?<![0-9])910B1\b", 414.0, "Ascend 910B1: fp16 414 TFLOPS as commonly quoted (no Huawei datasheet per variant)"),
    (r"(?<![0-9])910B2\b", 376.0, "Ascend 910B2: fp16 376 TFLOPS as commonly quoted (no Huawei datasheet per variant)"),
    (r"(?<![0-9])910B3\b", 313.0, "Ascend 910B3: fp16 313 TFLOPS as commonly quoted (no Huawei datasheet per variant)"),
    (r"(?<![0-9])910B4\b", 280.0, "Ascend 910B4: fp16 280 TFLOPS as commonly quoted (no Huawei datasheet per variant)"),
    (r"(?<![0-9])910(A|PROA|PREMIUMA)?\b", 256.0, "Huawei's Ascend 910 launch (2019): fp16 256 TFLOPS"),
)

_PATTERNS = tuple((re.compile(pattern, re.IGNORECASE), peak, source) for pattern, peak, source in KNOWN_DEVICES)


def known_device(name: str | None) -> tuple[float, str] | None:
    """``(peak TFLOPS, its source)`` of the device named ``name`` (NVML's or npu-smi's words); None when unknown."""
    if not name:
        return None
    text = " ".join(name.replace("-", " ").split())
    for pattern, peak, source in _PATTERNS:
        if pattern.search(text):
            return peak, source
    return None


def peak_tflops(name: str | None) -> float | None:
    """The dense bf16/fp16 peak TFLOPS of the device named ``name``; None when the table does not know it."""
    found = known_device(name)
    return found[0] if found else None
