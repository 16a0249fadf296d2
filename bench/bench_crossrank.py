"""Cross-rank costs: the band over a long 8-rank run, rank 0's watch over the other ranks' files, and 1,024 ranks.

``python -m bench crossrank``

1. ``band()`` (numpy, one grid) against the obvious per-step Python loop over the same series.
2. Rank 0's :class:`CrossRankWatch` (tail 8 files, join by step, straggler rule) per step, against
   what rank 0's worker thread does anyway per step (its own ``RunWriter.write``). Both run on the
   worker thread, never on the training thread.
3. A synthetic run of 1,024 ranks x 100,000 steps: rank 0's cross-rank pass per heartbeat (CPU ms;
   target <= 100 ms) and the dashboard's band query from a fresh server (target <= 1 s). The band
   files hold all 100,000 steps; each rank's metrics file holds its last 1,000 (the whole JSONL would
   be ~12 GB, and neither measure reads old lines: the watch tails new ones, the band reads ``bands/``).
"""

from __future__ import annotations

import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench_overhead import call_seconds
from mindwatch.alerts.crossrank import CrossRankWatch, WatchedRun
from mindwatch.alerts.liveness import RankLiveness
from mindwatch.analysis.bands import band_of
from mindwatch.config import load_config
from mindwatch.monitor.role import RankRole
from mindwatch.store.bandfiles import BandFileWriter, band_rows
from mindwatch.store.jsonl import encode_line
from mindwatch.store.layout import RunLayout, write_json_atomic
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


def bench_band(steps: int = 200_000) -> None:
    series = {r: _series(steps, r) for r in range(RANKS)}
    b = band_of("step_time", series)
    lo, mean, hi = _loop_band(series)
    assert np.allclose(b.min, lo) and np.allclose(b.mean, mean) and np.allclose(b.max, hi)
    t_np = min(call_seconds(lambda: band_of("step_time", series), 3))
    t_loop = min(call_seconds(lambda: _loop_band(series), 3))
    print(f"band over {RANKS} ranks x {steps:,} steps: numpy {t_np * 1000:.1f} ms | per-step Python loop {t_loop * 1000:.1f} ms")
    print(f"  ratio loop / numpy: {t_loop / t_np:.1f} x")


def bench_watch(steps: int = 3000, batch: int = 20) -> None:
    cfg = load_config({"distributed": {"poll_secs": 1e-9}})
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        writers = [RunWriter(run_dir, r, flush_secs=1e9) for r in range(RANKS)]
        alerts: list = []
        watch = CrossRankWatch(WatchedRun(run_dir, RankRole(0, RANKS)), alerts.append, cfg.distributed, cooldown_secs=0)
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


def synthetic_run(root: Path, ranks: int, steps: int, tail: int = 1000) -> Path:
    """A run directory of ``ranks`` ranks x ``steps`` steps (band files complete, metrics files: the last ``tail``)."""
    run_dir = root / "scale" / "run_1024"
    layout = RunLayout(run_dir)
    run_dir.mkdir(parents=True)
    write_json_atomic(layout.meta, {"run_id": run_dir.name, "project": "scale", "world_size": ranks, "started_at": time.time()})
    rng = np.random.default_rng(0)
    bands = BandFileWriter(layout)
    chunk = 2000
    who = np.arange(ranks)
    for metric, scale in (("loss", 2.0), ("step_time", 0.1), ("data_time", 0.01)):
        for start in range(1, steps + 1, chunk):
            n = min(chunk, steps + 1 - start)
            values = scale * (1 + 0.1 * rng.random((n, ranks)))
            bands.append(metric, band_rows(list(range(start, start + n)), who, values))
    now = time.time()
    host = socket.gethostname()
    first = steps - tail + 1
    for r in range(ranks):
        lines = b"".join(
            encode_line({"step": s, "t": now, "rank": r, "loss": 2.0, "step_time": 0.1, "data_time": 0.01})
            for s in range(first, steps + 1)
        )
        layout.metrics(r).write_bytes(lines)
        status = {"rank": r, "pid": os.getpid(), "host": host, "state": "running", "last_step": steps, "updated_at": now}
        write_json_atomic(layout.status(r), status)
    return run_dir


def bench_scale(ranks: int = 1024, steps: int = 100_000, heartbeats: int = 10, per_beat: int = 2) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_dir = synthetic_run(Path(tmp), ranks, steps)
        print(f"synthetic run: {ranks:,} ranks x {steps:,} steps written in {time.perf_counter() - t0:.1f} s")
        cfg = load_config({"distributed": {"poll_secs": 1e-9, "liveness_secs": 1e-9}})
        alerts: list = []
        watch = CrossRankWatch(WatchedRun(run_dir, RankRole(0, ranks)), alerts.append, cfg.distributed, cooldown_secs=0)
        layout = RunLayout(run_dir)
        cpu, remote = [], []
        step, slow = steps, ranks - 3
        for _ in range(heartbeats):
            for r in range(ranks):  # the other ranks' new lines of one heartbeat (not measured: their own work)
                recs = [
                    {
                        "step": s,
                        "t": time.time(),
                        "rank": r,
                        "loss": 2.0,
                        "step_time": 0.1,
                        "data_time": 0.3 if r == slow else 0.01,
                    }
                    for s in range(step + 1, step + 1 + per_beat)
                ]
                with open(layout.metrics(r), "ab") as f:
                    f.write(b"".join(encode_line(x) for x in recs))
            step += per_beat
            t0 = time.process_time()
            watch._last_remote = -1e18  # every pass reads the remote heartbeats too: the worst case
            watch.poll()
            watch.tick()
            cpu.append(time.process_time() - t0)
            far = RankLiveness(layout, ranks, stale_secs=1e9, host="elsewhere")  # as if every rank were on another host
            far.check()  # learns every rank's process from its status file: all on another host than "elsewhere"
            t0 = time.process_time()
            assert far.check(remote=True) == []
            remote.append(time.process_time() - t0)
        median = statistics.median(cpu) * 1000
        print(
            f"rank 0 cross-rank pass per heartbeat, {ranks:,} ranks x {per_beat} new steps: median {median:.0f} ms CPU "
            f"(mean {statistics.fmean(cpu) * 1000:.0f} ms, max {max(cpu) * 1000:.0f} ms; target <= 100 ms): "
            "tails, join by step, straggler rule, band rows, pid checks"
        )
        print(f"  of which reading {ranks - 1:,} remote heartbeats (status files): {statistics.median(remote) * 1000:.0f} ms CPU")
        assert {a["rank"] for a in alerts if a["rule"] == "straggler"} == {slow}, alerts
        from starlette.testclient import TestClient

        from mindwatch.serve.app import create_app

        with TestClient(create_app(Path(tmp))) as c:
            t0 = time.perf_counter()
            body = c.get("/api/band", params={"run": "scale/run_1024", "metric": "data_time"}).json()
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            c.get("/api/band", params={"run": "scale/run_1024", "metric": "step_time"}).json()
            second = time.perf_counter() - t0
        assert len(body["ranks"]) == ranks and body["points"][-1][0] > steps, body["points"][-1]
        print(
            f"dashboard band query, fresh server, {ranks:,} ranks x {steps:,} steps: {cold * 1000:.0f} ms "
            f"(next metric {second * 1000:.0f} ms; target <= 1 s), {len(body['points'])} points"
        )


def main() -> None:
    bench_band()
    bench_watch()
    bench_scale()


if __name__ == "__main__":
    main()
