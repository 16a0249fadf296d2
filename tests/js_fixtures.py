"""The server's real responses, captured from a real run, for the JavaScript's tests (``tests/js/*.test.mjs``).

A loop of our own trains a small network for 60 calls in PyNative mode: step 12's loss is NaN (a bad batch), at call 40
a person asks for a rewind to step 30's snapshot (taken a few steps later), and the last step's loss is NaN, so the
responses hold non-finite marks, an abandoned branch and a live row that is not a number. Every 15 calls the network
is evaluated on a held-out batch (``run.eval``: its loss and the share of it within 0.5), so the run has evaluations.
The dashboard's own app (``create_app``) answers the requests the pages make; the live stream's ``points`` message
comes from its own code (``LiveHub._delta``) for the last rows written.

    .venv/bin/python tests/js_fixtures.py tests/js/fixtures     # the committed fixtures a bare `node --test` reads

``tests/test_javascript.py`` captures them afresh into a temporary folder, checks that the committed ones still have
their shape, and runs ``node --test`` on the fresh ones.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

NAN_STEP, REWIND_AT, REWIND_TO, STEPS, EVAL_EVERY = 12, 40, 30, 60, 15


def train(save_dir: Path) -> Path:
    """The run: returns its directory."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    import mindwatch.mindspore as mw
    from mindwatch.demo.tutorial_step import jit_train_step
    from mindwatch.store.requests import FINAL_ANSWERS, file_request, read_answer

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.02, momentum=0.9)
    step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)
    rng = np.random.default_rng(0)
    held_x = rng.normal(size=(64, 8)).astype(np.float32)
    held_y = held_x.sum(axis=1, keepdims=True)
    config = {"save_dir": str(save_dir), "project": "js", "run_name": "fixture", "rewind": {"every": 10, "skip": 0}}
    request = None
    with mw.start_run(config, network=net, optimizer=opt) as run:
        for i in range(1, STEPS + 1):
            x = ms.Tensor(rng.normal(size=(16, 8)).astype(np.float32))
            y = ms.Tensor(x.asnumpy().sum(axis=1, keepdims=True))
            loss, grads = step(x, y)
            run.step(loss=float("nan") if i == NAN_STEP else loss, grads=grads)
            if i % EVAL_EVERY == 0:
                error = net(ms.Tensor(held_x)).asnumpy() - held_y
                run.eval(loss=float((error**2).mean()), accuracy=float((np.abs(error) < 0.5).mean()), epoch=i // EVAL_EVERY)
            if i == STEPS:  # the last step's loss NaN too: the live stream's last rows hold one
                run.step(loss=float("nan"), grads=grads)
            if i == REWIND_AT:
                request = file_request(run.run_dir, "rewind", to_step=REWIND_TO)
                deadline = time.monotonic() + 60
                while (read_answer(run.run_dir, request["id"]) or {}).get("state") not in FINAL_ANSWERS:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the rewind request was not answered in 60 s: {request}")
                    run.step(loss=loss, grads=grads)  # the step boundary that takes it
                    time.sleep(0.05)
    return Path(run.run_dir)


def capture(run_dir: Path, out: Path) -> dict[str, Any]:
    """Ask the dashboard what the pages ask, for the run in ``run_dir``; write each answer to ``out/<name>.json``."""
    from starlette.testclient import TestClient

    from mindwatch.serve.app import create_app
    from mindwatch.serve.live import LiveHub
    from mindwatch.serve.views import RunView

    logdir = run_dir.parent.parent
    run_id = f"{run_dir.parent.name}/{run_dir.name}"
    got: dict[str, Any] = {}
    with TestClient(create_app(logdir)) as c:

        def get(name: str, url: str, **params: Any) -> None:
            r = c.get(url, params=params)
            assert r.status_code == 200, (url, params, r.text)
            got[name] = r.json()

        get("vocabulary", "/api/vocabulary")
        get("run", "/api/run", run=run_id)
        get("series_loss", "/api/series", run=run_id, metric="loss", rank=0, x="step", points=2000)
        get("series_loss_window", "/api/series", run=run_id, metric="loss", rank=0, x="step", points=2000, lo=20, hi=35)
        get("series_loss_time", "/api/series", run=run_id, metric="loss", rank=0, x="time", points=2000)
        get("series_eval_loss", "/api/series", run=run_id, metric="eval/loss", rank=0, x="step", points=2000)
        get("band_loss", "/api/band", run=run_id, metric="loss", points=2000)
        get("compare_loss", "/api/compare", runs=run_id, metric="loss", x="elapsed", points=2000)
    view = RunView(run_id, run_dir, logdir.resolve())
    view.refresh()
    cols = view.columns[0]
    # the last rows, after the steps the rewind wrote again (a cursor before those gets "reload" instead)
    events, *_ = LiveHub._delta(view, ["loss"], {0: (cols.generation, cols.lines - 3)}, len(view.alerts), None)
    points = [e for e in events if "event: points" in e]
    assert points, events
    got["live_points"] = json.loads(next(line[6:] for line in points[0].splitlines() if line.startswith("data: ")))
    out.mkdir(parents=True, exist_ok=True)
    for name, body in got.items():
        (out / f"{name}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    return got


def shape(value: Any) -> Any:
    """A response's shape: its keys and the kinds of its values, not the values (a fresh run's differ)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__ if value is not None else None


def main(argv: list[str]) -> int:
    import tempfile

    out = Path(argv[0] if argv else "tests/js/fixtures")
    with tempfile.TemporaryDirectory() as tmp:
        capture(train(Path(tmp)), out)
    print(f"wrote {len(list(out.glob('*.json')))} responses to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
