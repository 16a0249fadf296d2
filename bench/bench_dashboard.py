"""Dashboard: a 1,000,000-step run opens fast; a new point reaches 50 live clients fast; 5,000 runs list fast.

    .venv/bin/python -m bench dashboard            # --only runs: the 5,000-run listing alone

1. Chart query: a synthetic run of 1,000,000 steps x 10 metrics (~230 MB of JSONL) written by
   RunWriter, so with the column files training writes beside it (mindwatch.store.columnfiles).
   A fresh ``mindwatch serve`` process answers its first 2,000-point ``/api/series`` query (cold:
   it has never read the run), then the same query again (warm), a zoomed window, and a second
   metric; then a restarted server. All of it again on the same JSONL without column files (a
   run from another tool or an older mindwatch), where the restarted server answers from the
   column cache the first one left (mindwatch.store.cache). Baseline: what the seed's Flask app
   does per query, ``json.loads`` of every line.
2. Live latency: 50 SSE clients watch a run while a writer appends one record every 100 ms; latency
   is from the write to each client receiving the point. Baseline: the seed's 3 s polling, whose
   wait alone is uniform in [0, 3 s] (p95 = 2.85 s, before any request time).
3. Layers: a run of 1,000,000 steps whose train cell measured 100 layers x 3 statistics every 10
   steps (300 per-layer series, 100,000 rows in ``layers.rank0/``, mindwatch.store.layerfiles). A
   fresh server answers the first chart (loss), the layers heat map (100 rows) and one layer's curve,
   cold. Target: the first chart within 1 s.
4. Many runs: 5,000 finished runs of 100 steps (meta with a config snapshot, status, metrics,
   alerts) under one LOGDIR. A fresh ``mindwatch serve`` answers ``/api/runs`` with two config
   columns, a filter (``lr > 1e-3 and final(loss) < 2``) and a sort: first request (cold: it has
   never listed them) and again (warm, the listing is re-read from the files each time).
   Baseline: ``mindwatch check``'s evaluation of the same filter on every run (``open_run``, the
   metrics read), on the first 200 runs, scaled to 5,000.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from mindwatch.serve.process import DashboardProcess
from mindwatch.store.columnfiles import read_column_files
from mindwatch.store.writer import RunWriter

STEPS = 1_000_000
METRICS = ["loss", "lr", "grad_norm", "step_time", "data_time", "samples_per_second", "tokens_per_second", "host_rss_gb"]
SPIKE_STEP = 612_345
CLIENTS = 50
RECORDS = 60
FLUSH_EVERY = 1000


def write_long_run(root: Path) -> Path:
    """meta + ``STEPS`` records of step, t and 10 metrics (incl. epoch and an entropy), written by RunWriter.

    RunWriter also writes the column files (mindwatch.store.columnfiles) at every flush, as in
    training; here every ``FLUSH_EVERY`` records (a 2 s heartbeat at ~500 steps/s).
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps({"run_id": root.name, "project": "bench", "started_at": 1.7e9}))
    rng = np.random.default_rng(0)
    loss = 2.0 + 0.05 * rng.standard_normal(STEPS)
    loss[SPIKE_STEP - 1] = 40.0
    cols = {m: np.round(rng.random(STEPS) + 1, 5).tolist() for m in METRICS[1:]}
    loss = np.round(loss, 5).tolist()
    writer = RunWriter(root, rank=0)
    for chunk in range(0, STEPS, FLUSH_EVERY):
        records = []
        for i in range(chunk, min(chunk + FLUSH_EVERY, STEPS)):
            rec = {"step": i + 1, "epoch": 1, "t": round(1.7e9 + i * 0.1, 3), "loss": loss[i]}
            rec.update({m: cols[m][i] for m in METRICS[1:]})
            rec["attention_entropy/0"] = 1.5
            records.append(rec)
        writer.write(records)
        writer.flush()
    writer.close("finished")
    return writer.layout.metrics(0)


LAYERS, LAYER_EVERY, LAYER_SPIKE = 100, 10, 712_340


def write_layer_run(root: Path) -> None:
    """``STEPS`` records of loss and step_time, with per-layer statistics of ``LAYERS`` layers every ``LAYER_EVERY`` steps."""
    from mindwatch.store.layerfiles import LAYER_KEY, LayerRow

    root.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps({"run_id": root.name, "project": "bench", "started_at": 1.7e9}))
    rng = np.random.default_rng(1)
    layers = tuple(f"blocks.{i // 4}.{('attn.qkv', 'attn.proj', 'mlp.0', 'mlp.2')[i % 4]}" for i in range(LAYERS))
    writer = RunWriter(root, rank=0)
    writer.set_layers(list(layers))
    for chunk in range(0, STEPS, FLUSH_EVERY):
        records = []
        for i in range(chunk, min(chunk + FLUSH_EVERY, STEPS)):
            step = i + 1
            rec = {"step": step, "t": round(1.7e9 + i * 0.1, 3), "loss": 2.0, "step_time": 0.1}
            if step % LAYER_EVERY == 0:
                stats = rng.random((3, LAYERS), dtype=np.float32) + 0.5
                if step == LAYER_SPIKE:
                    stats[0, 7] = 500.0  # one layer's gradient spikes once: the curve must keep it
                rec[LAYER_KEY] = LayerRow(layers, stats)
            records.append(rec)
        writer.write(records)
        writer.flush()
    writer.close("finished")


def layer_queries(logdir: Path) -> None:
    root = logdir / "bench" / "layers"
    if not (root / "layers.rank0" / "values.f32").exists():
        t = time.perf_counter()
        write_layer_run(root)
        print(f"(wrote the layer run in {time.perf_counter() - t:.0f} s)")
    size = sum(p.stat().st_size for p in (root / "layers.rank0").iterdir())
    print(
        f"layers: {STEPS:,} steps, {LAYERS} layers x 3 statistics every {LAYER_EVERY} steps ({size / 1e6:.0f} MB of layer rows):"
    )
    shutil.rmtree(os.environ["MINDWATCH_CACHE_DIR"], ignore_errors=True)
    with DashboardProcess(logdir, port=0) as dash, httpx.Client(base_url=dash.url, timeout=600) as c:
        run = "bench/layers"
        t = time.perf_counter()
        c.get("/api/series", params={"run": run, "metric": "loss", "points": 2000}).raise_for_status()
        first = time.perf_counter() - t
        t = time.perf_counter()
        heat = c.get("/api/heatmap", params={"run": run, "prefix": "grad_norm/", "buckets": 120}).json()
        heat_s = time.perf_counter() - t
        assert len(heat["layers"]) == LAYERS, len(heat["layers"])
        t = time.perf_counter()
        layer = c.get("/api/series", params={"run": run, "metric": "grad_norm/blocks.1.mlp.2", "points": 2000}).json()
        curve_s = time.perf_counter() - t
        assert layer["total"] == STEPS // LAYER_EVERY and [LAYER_SPIKE, 500.0] in layer["points"], "the layer spike must survive"
    print(f"  first chart (loss), cold server          {first:8.3f} s   (target <= 1 s)")
    print(f"  layers heat map (100 rows x 120 buckets)  {heat_s:8.3f} s")
    print(f"  one layer's curve (100,000 rows)          {curve_s:8.3f} s")


def naive_query(path: Path, metric: str) -> int:
    """The seed's way: parse the whole file for every chart request."""
    values = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if metric in rec:
                values.append((rec["step"], rec[metric]))
    return len(values)


def _cold_then_warm(logdir: Path, run: str) -> dict[str, float]:
    """A fresh server's first query on ``run``, then warm, run info, zoom, a second metric; then a restarted server."""
    shutil.rmtree(os.environ["MINDWATCH_CACHE_DIR"], ignore_errors=True)  # cold: no column cache either
    with open(logdir / run / "metrics.rank0.jsonl", "rb") as f:  # the OS page cache holds the file, as for a file being written
        while f.read(1 << 24):
            pass
    out: dict[str, float] = {}
    q = {"run": run, "metric": "loss", "points": 2000}
    with DashboardProcess(logdir, port=0) as dash, httpx.Client(base_url=dash.url, timeout=600) as c:
        t = time.perf_counter()
        body = c.get("/api/series", params=q).json()
        out["cold"] = time.perf_counter() - t
        assert body["total"] == STEPS and [SPIKE_STEP, 40.0] in body["points"], "the spike must survive downsampling"
        warm = []
        for _ in range(5):
            t = time.perf_counter()
            c.get("/api/series", params=q).raise_for_status()
            warm.append(time.perf_counter() - t)
        out["warm"] = statistics.median(warm)
        t = time.perf_counter()
        metrics = c.get("/api/run", params={"run": run}).json()["metrics"]
        out["info"] = time.perf_counter() - t
        assert len(metrics) == 10, metrics
        t = time.perf_counter()
        win = c.get("/api/series", params={**q, "lo": 500_000, "hi": 520_000}).json()
        out["zoom"] = time.perf_counter() - t
        out["zoom_points"] = len(win["points"])
        t = time.perf_counter()
        c.get("/api/series", params={**q, "metric": "grad_norm"}).raise_for_status()
        out["second"] = time.perf_counter() - t
    # A restarted server: the columns the first one parsed are in the column cache (mindwatch.store.cache).
    with DashboardProcess(logdir, port=0) as dash, httpx.Client(base_url=dash.url, timeout=600) as c:
        t = time.perf_counter()
        body = c.get("/api/series", params=q).json()
        out["restarted"] = time.perf_counter() - t
        assert [SPIKE_STEP, 40.0] in body["points"]
    return out


def chart_query(logdir: Path) -> None:
    path = logdir / "bench" / "long" / "metrics.rank0.jsonl"
    if not path.exists() or read_column_files(path) is None:
        shutil.rmtree(path.parent, ignore_errors=True)
        t = time.perf_counter()
        write_long_run(path.parent)
        print(f"generated {STEPS:,} steps x 10 metrics ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s")
    # The same JSONL without column files: a run written by another tool or an older mindwatch.
    bare = logdir / "bench" / "long-jsonl-only" / "metrics.rank0.jsonl"
    shutil.rmtree(bare.parent, ignore_errors=True)
    bare.parent.mkdir(parents=True)
    shutil.copyfile(path.parent / "meta.json", bare.parent / "meta.json")
    os.link(path, bare)
    files_mb = sum(p.stat().st_size for p in (path.parent / "columns.rank0").iterdir()) / 1e6
    with_files = _cold_then_warm(logdir, "bench/long")
    jsonl_only = _cold_then_warm(logdir, "bench/long-jsonl-only")
    t = time.perf_counter()
    n = naive_query(path, "loss")
    naive = time.perf_counter() - t
    assert n == STEPS
    print(f"chart query, {STEPS:,}-step run ({path.stat().st_size / 1e6:.0f} MB JSONL + {files_mb:.0f} MB column files),")
    print("2,000 points (min/max per bucket; the planted spike kept):")
    print(f"  {'':42s} {'column files':>14s} {'JSONL only':>12s}")
    rows = [
        ("cold (fresh server, file never read)", "cold"),
        ("restarted server (column cache)", "restarted"),
        ("warm (median of 5)", "warm"),
        ("run info, metric names (first)", "info"),
        (f"zoom 20,000 steps -> {with_files['zoom_points']:.0f} points", "zoom"),
        ("second metric, first time (grad_norm)", "second"),
    ]
    for label, key in rows:
        print(f"  {label:42s} {with_files[key]:12.3f} s {jsonl_only[key]:10.3f} s")
    print(f"  target for cold: <= 1 s; naive json.loads of every line (the seed): {naive:.3f} s")
    ratios = f"{naive / with_files['cold']:.0f}x with column files, {naive / jsonl_only['cold']:.1f}x JSONL only"
    print(f"  ratio naive / cold: {ratios}")


async def _client(url: str, sent: dict[int, float], got: list[float], ready: asyncio.Event, n_ready: list[int]) -> None:
    async with (
        httpx.AsyncClient(base_url=url, timeout=120) as c,
        c.stream("GET", "/api/live", params={"run": "bench/live", "metrics": "loss"}) as r,
    ):
        n_ready[0] += 1
        if n_ready[0] == CLIENTS:
            ready.set()
        event = ""
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "points":
                now = time.time()
                for step, _t, _v in json.loads(line[6:])["metrics"].get("loss", []):
                    if step in sent:
                        got.append(now - sent[step])
                    if step == RECORDS:
                        return


async def _live(url: str, writer: RunWriter) -> list[float]:
    sent: dict[int, float] = {}
    got: list[float] = []
    ready = asyncio.Event()
    n_ready = [0]
    tasks = [asyncio.create_task(_client(url, sent, got, ready, n_ready)) for _ in range(CLIENTS)]
    await asyncio.wait_for(ready.wait(), 60)
    await asyncio.sleep(1.0)

    def write() -> None:
        for step in range(1, RECORDS + 1):
            sent[step] = time.time()
            writer.write([{"step": step, "t": sent[step], "loss": 1.0 / step}])
            time.sleep(0.1)

    await asyncio.to_thread(write)
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    return got


def live_latency(logdir: Path) -> None:
    root = logdir / "bench" / "live"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    writer = RunWriter(root, 0)
    with DashboardProcess(logdir, port=0) as dash:
        got = asyncio.run(_live(dash.url, writer))
    writer.close("finished")
    lat = np.array(got)
    p50, p95, worst = np.percentile(lat, 50), np.percentile(lat, 95), lat.max()
    polling_p95 = 0.95 * 3.0
    print(f"live latency, write -> SSE client, {CLIENTS} concurrent clients, {RECORDS} records at 10/s ({len(lat)} deliveries):")
    print(f"  p50 {p50 * 1000:6.0f} ms   p95 {p95 * 1000:6.0f} ms   max {worst * 1000:6.0f} ms   (target p95 <= 1 s)")
    print(f"  seed's 3 s polling, wait alone: p95 {polling_p95 * 1000:.0f} ms -> ratio {polling_p95 / p95:.1f}x")
    if len(lat) != CLIENTS * RECORDS:
        print(f"  WARNING: {CLIENTS * RECORDS - len(lat)} deliveries missing")


MANY_RUNS = 5000
MANY_STEPS = 100


def write_many_runs(logdir: Path) -> Path:
    """``MANY_RUNS`` finished runs under ``logdir/many`` (written once, reused by later rounds)."""
    root = logdir / "many"
    done = root / ".complete"
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    for i in range(MANY_RUNS):
        d = root / f"team{i % 10}" / f"run_{i:05d}"
        config = {"optimizer": {"lr": 10.0 ** -(1 + i % 4), "name": "adamw"}, "batch_size": 2 ** (3 + i % 5)}
        meta = {"run_id": d.name, "project": d.parent.name, "started_at": 1.7e9 + i, "ended_at": 1.7e9 + i + 600}
        d.mkdir(parents=True)
        writer = RunWriter(d, 0, column_files=False)
        writer.write([{"step": s, "t": 1.7e9 + i + s, "loss": 3.0 / s + (i % 7) * 0.01} for s in range(1, MANY_STEPS + 1)])
        if i % 50 == 0:
            writer.append_alert({"t": 1.7e9 + i, "step": 3, "rank": 0, "rule": "spike", "severity": "warning"})
        writer.close("finished")
        (d / "meta.json").write_text(json.dumps({**meta, "tags": {"mode": "graph"}, "total_steps": MANY_STEPS, "config": config}))
    done.touch()
    return root


def many_runs(logdir: Path) -> None:
    from urllib.parse import urlencode

    from mindwatch.checks.evaluate import evaluate
    from mindwatch.store.catalog import find_runs
    from mindwatch.store.reader import open_run

    root = write_many_runs(logdir)
    query = urlencode({"columns": "config.optimizer.lr,config.batch_size,final_loss", "filter": "lr > 1e-3 and final(loss) < 2",
                       "sort": "-final_loss"})  # fmt: skip
    with DashboardProcess(root, port=0) as dash, httpx.Client(timeout=120) as client:
        times, body = [], {}
        for _ in range(3):
            t0 = time.perf_counter()
            r = client.get(f"{dash.url}api/runs?{query}")
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
            body = r.json()
            time.sleep(1.1)  # past the catalog's rescan interval: each request lists the directories again
    paths = find_runs(root)[:200]
    t0 = time.perf_counter()
    for p in paths:
        evaluate(open_run(p), "final(loss) < 2")
    naive = (time.perf_counter() - t0) * MANY_RUNS / len(paths)
    print(f"runs listing, {MANY_RUNS:,} runs, /api/runs with 3 columns, a filter and a sort ({len(body['runs'])} shown):")
    print(f"  first {times[0]:.3f} s   again {times[1]:.3f} s, {times[2]:.3f} s   (target <= 1 s)")
    print(f"  mindwatch check's evaluation of final(loss) on every run (open_run), scaled from 200: {naive:.1f} s")


def main(argv: list[str] | None = None) -> None:
    """``--only chart,live,layers,runs``: the parts to run (all by default)."""
    base = Path(os.environ.get("MINDWATCH_BENCH_DIR") or tempfile.gettempdir()) / "mindwatch-bench-dashboard"
    logdir = base / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    os.environ["MINDWATCH_CACHE_DIR"] = str(base / "column-cache")  # inherited by the servers started here
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.1f} at start; python {sys.version.split()[0]}")
    argv = list(argv or [])
    only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else ["chart", "live", "layers", "runs"]
    if "chart" in only:
        chart_query(logdir)
    if "live" in only:
        live_latency(logdir)
    if "layers" in only:
        layer_queries(logdir)
    if "runs" in only:
        many_runs(logdir)


if __name__ == "__main__":
    main(sys.argv[1:])
