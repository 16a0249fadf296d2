"""Cross-rank costs: the band over a long 8-rank run, and rank 0's watch over the other ranks' files.

``python -m bench crossrank``

1. ``band()`` (numpy, one grid) against the obvious per-step Python loop over the same series.
2. Rank 0's :class:`CrossRankWatch` (tail 8 files, join by step, straggler rule) per step, against
   what rank 0's worker thread does anyway per step (its own ``RunWriter.write``). Both run on the
   worker thread, never on the training thread.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from mindwatch.alerts.crossrank import CrossRankWatch
from mindwatch.analysis.bands import band_of
from mindwatch.config import load_config
from mindwatch.store.reader import Series
from mindwatch.store.writer import RunWriter

RANKS = 8


def _series(steps: int, rank: int) -> Series:
    rng = np.random.default_rng(rank)
    step = np.arange(1, steps + 1, dtype=np.int64)
    return Series(step, rng.gamma(2.0, 0.05, steps), step.astype(np.float64))


def _loop_band(series: dict[int, Series]) -> tuple[list[float], list[float], list[float]]:
    by_step: dict[int, list[float]] = {}
    for s in series.values():
        for st, v in zip(s.step.tolist(), s.value.tolist(), strict=True):
            by_step.setdefault(st, []).append(v)
    lo, mean, hi = [], [], []
    for st in sorted(by_step):
        vals = by_step[st]
        lo.append(min(vals))
        mean.append(sum(vals) / len(vals))
        hi.append(max(vals))
    return lo, mean, hi


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_band(steps: int = 200_000) -> None:
    series = {r: _series(steps, r) for r in range(RANKS)}
    b = band_of("step_time", series)
    lo, mean, hi = _loop_band(series)
    assert np.allclose(b.min, lo) and np.allclose(b.mean, mean) and np.allclose(b.max, hi)
    t_np = _best(lambda: band_of("step_time", series))
    t_loop = _best(lambda: _loop_band(series))
    print(f"band over {RANKS} ranks x {steps:,} steps: numpy {t_np * 1000:.1f} ms | per-step Python loop {t_loop * 1000:.1f} ms")
    print(f"  ratio loop / numpy: {t_loop / t_np:.1f} x")


def bench_watch(steps: int = 3000, batch: int = 20) -> None:
    cfg = load_config({"distributed": {"poll_secs": 1e-9}})
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        writers = [RunWriter(run_dir, r, flush_secs=1e9) for r in range(RANKS)]
        alerts: list = []
        watch = CrossRankWatch(run_dir, RANKS, alerts.append, cfg.distributed, cooldown_secs=0)
        own, cross = [], []
        for start in range(1, steps + 1, batch):
            recs = {
                r: [
                    {"step": s, "t": time.time(), "rank": r, "loss": 2.0, "step_time": 0.1, "data_time": 0.3 if r == 5 else 0.01}
                    for s in range(start, start + batch)
                ]
                for r in range(RANKS)
            }
            t0 = time.perf_counter()
            writers[0].write(recs[0])
            own.append(time.perf_counter() - t0)
            for r in range(1, RANKS):
                writers[r].write(recs[r])
            t0 = time.perf_counter()
            watch.poll()
            cross.append(time.perf_counter() - t0)
        for w in writers:
            w.close()
    assert [a["rank"] for a in alerts] == [5], alerts
    per_step_own = statistics.median(own) / batch * 1e6
    per_step_cross = statistics.median(cross) / batch * 1e6
    print(
        f"rank 0 worker per step ({batch} steps per poll, {RANKS} ranks): own RunWriter.write {per_step_own:.1f} us | "
        f"CrossRankWatch.poll {per_step_cross:.1f} us ({per_step_cross / RANKS:.1f} us per rank-record)"
    )
    print(f"  ratio watch / own write: {per_step_cross / per_step_own:.1f} x (worker thread only)")


def main() -> None:
    bench_band()
    bench_watch()


if __name__ == "__main__":
    main()
