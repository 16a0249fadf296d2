"""Per-record cost of the TensorBoard and Prometheus sinks and of the run writer's column files, on the worker thread.

Run: ``.venv/bin/python -m bench sinks``. Records carry 6 scalars (plus step, epoch, t, rank),
as the demo's do. Peer: tensorboardX ``SummaryWriter.add_scalar`` per value (what MindFormers
uses), timed including its ``close()`` (its own writer thread flushes then). Same run, same disk.
The column files (mindwatch.store.columnfiles) are timed as RunWriter with them against RunWriter
without them (``column_files=False``), with a heartbeat flush every ``FLUSH_EVERY`` batches.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from mindwatch.sinks import tensorboard as tb
from mindwatch.sinks.prometheus import PrometheusSink
from mindwatch.store.writer import RunWriter

N = 20_000
BATCH = 20  # records per worker poll at ~400 steps/s with the 50 ms poll
FLUSH_EVERY = 40  # batches per heartbeat: flush_secs=2 with the 50 ms poll


def records(n: int) -> list[dict]:
    t0 = time.time()
    return [
        {
            "step": i + 1,
            "epoch": 1,
            "t": t0 + i * 0.01,
            "rank": 0,
            "loss": 2.0 + 1.0 / (i + 1),
            "lr": 1e-4,
            "grad_norm": 0.5 + (i % 7) * 0.01,
            "step_time": 0.01,
            "data_time": 0.001,
            "samples_per_second": 800.0,
        }
        for i in range(n)
    ]


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    recs = records(N)
    scalars = [k for k in recs[0] if k not in ("step", "t", "rank")]
    tmp = Path(tempfile.mkdtemp(prefix="mindwatch-bench-sinks-"))
    try:
        from tensorboardX import SummaryWriter

        def tensorboardx() -> None:
            w = SummaryWriter(str(tmp / "tbx"))
            for r in recs:
                for k in scalars:
                    w.add_scalar(k, r[k], r["step"], walltime=r["t"])
            w.close()

        def ours(batch: int) -> None:
            sink = tb.TensorBoardSink(tmp / f"ours{batch}")
            for i in range(0, N, batch):
                sink.write(recs[i : i + batch])
            sink.close("finished")

        def prometheus() -> None:
            sink = PrometheusSink(project="bench", run="r", rank=0, port=0)
            for i in range(0, N, BATCH):
                sink.write(recs[i : i + BATCH])
            sink.close("finished")

        def run_writer(column_files: bool) -> None:
            w = RunWriter(tmp / f"writer_{column_files}", 0, column_files=column_files)
            for k, i in enumerate(range(0, N, BATCH), start=1):
                w.write(recs[i : i + BATCH])
                if k % FLUSH_EVERY == 0:
                    w.flush()
            w.close("finished")

        event = tb.scalars_event(recs[0])
        assert event is not None
        payload = event[12:-4]
        crc_n = 20_000

        def ours_pure_python_crc() -> None:
            native, tb._crc32c = tb._crc32c, tb._crc32c_python
            try:
                ours(BATCH)
            finally:
                tb._crc32c = native

        rows = [
            ("tensorboardX add_scalar x7 (peer)", _time(tensorboardx)),
            (f"mindwatch TensorBoardSink, batches of {BATCH}", _time(lambda: ours(BATCH))),
            ("mindwatch TensorBoardSink, one record per write", _time(lambda: ours(1))),
            ("mindwatch TensorBoardSink, pure-Python CRC-32C", _time(ours_pure_python_crc)),
            (f"mindwatch PrometheusSink, batches of {BATCH}", _time(prometheus)),
        ]
        crc = _time(lambda: [tb._crc32c(payload) for _ in range(crc_n)]) / crc_n
        writer_plain = min(_time(lambda: run_writer(False)) for _ in range(3))
        writer_columns = min(_time(lambda: run_writer(True)) for _ in range(3))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    peer = rows[0][1]
    print(f"{N} records, {len(scalars)} scalars each (per record, on the worker thread)")
    for name, secs in rows:
        print(f"  {name:<50} {secs / N * 1e6:8.1f} us/record   {peer / secs:6.1f}x faster than tensorboardX")
    native = "the crc32c package" if tb._crc32c is not tb._crc32c_python else "pure Python"
    print(f"  CRC-32C of one {len(payload)}-byte event ({native}): {crc * 1e6:.1f} us")
    flushes = N // BATCH // FLUSH_EVERY + 1
    print(f"RunWriter, {N} records in batches of {BATCH}, a heartbeat flush every {FLUSH_EVERY} batches (best of 3):")
    print(f"  without column files (peer)     {writer_plain / N * 1e6:8.1f} us/record")
    print(f"  with column files               {writer_columns / N * 1e6:8.1f} us/record")
    extra = writer_columns - writer_plain
    per_beat = extra / flushes * 1e3
    print(f"  column files: +{extra / N * 1e6:.1f} us/record, {per_beat:.1f} ms per heartbeat ({flushes} heartbeats)")
