"""A real text corpus that exists offline: the Python standard library's own source, as bytes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def stdlib_corpus(max_bytes: int = 2_000_000) -> np.ndarray:
    """Bytes of the standard library's ``.py`` files (sorted, so the same on every machine of a version)."""
    root = Path(os.__file__).parent
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if total < 10_000:
        raise RuntimeError(f"found only {total} bytes of Python source under {root}; cannot build the demo corpus")
    return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)


class ByteWindows:
    """Random-access dataset of ``(ids, targets)`` windows: targets are ids shifted by one byte."""

    def __init__(self, corpus: np.ndarray, seq_length: int, num_samples: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.corpus = corpus
        self.seq_length = seq_length
        self.starts = rng.integers(0, len(corpus) - seq_length - 1, size=num_samples)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s = int(self.starts[i])
        window = self.corpus[s : s + self.seq_length + 1].astype(np.int32)
        return window[:-1], window[1:]
