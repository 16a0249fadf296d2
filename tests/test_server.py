"""The dashboard's HTTP API on run directories written by the real writer: runs, series, alerts, states, safety."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_for
from starlette.testclient import TestClient

from mindwatch.serve.app import check_binding, create_app
from mindwatch.serve.process import free_port
from mindwatch.store.columns import RankColumns
from mindwatch.store.jsonl import decode_value, encode_line
from mindwatch.store.layout import write_json_atomic
from mindwatch.store.reader import open_run
from mindwatch.store.writer import RunWriter

REPO = Path(__file__).resolve().parent.parent


def make_run(
    logdir: Path,
    project: str,
    run: str,
    steps: int = 50,
    state: str | None = "finished",
    ranks: int = 1,
    tags: object = None,
    error: str | None = None,
) -> Path:
    """A run directory as the Monitor writes it: meta, metrics per rank, status per rank."""
    root = logdir / project / run
    root.mkdir(parents=True)
    write_json_atomic(
        root / "meta.json",
        {"run_id": run, "project": project, "tags": tags or [], "config": {"lr": 0.001}, "started_at": time.time() - 60},
    )
    for rank in range(ranks):
        w = RunWriter(root, rank)
        t0 = time.time() - steps * 0.01
        w.write([{"step": s, "t": t0 + s * 0.01, "loss": 3.0 - s / steps + rank, "lr": 1e-3} for s in range(1, steps + 1)])
        if state in ("finished", "failed", "stopped"):
            w.close(state, error=error)
        else:
            w.flush()
    return root


def append_alert(root: Path, alert: dict[str, object]) -> None:
    with open(root / "alerts.jsonl", "ab") as f:
        f.write(encode_line(alert))


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    return d


def client(logdir: Path, **kw: object) -> TestClient:
    return TestClient(create_app(logdir, **kw))  # type: ignore[arg-type]


def test_runs_page_lists_every_run_with_state_tags_and_alerts(logdir: Path) -> None:
    make_run(logdir, "gpt", "done", tags={"mode": "graph"})
    make_run(logdir, "gpt", "broken", state="failed", error="RuntimeError: boom")
    make_run(logdir, "bert", "live", state="running", tags=["nightly"])
    stale = make_run(logdir, "bert", "killed", state="running")
    status = json.loads((stale / "status.rank0.json").read_text())
    status["updated_at"] = time.time() - 600  # heartbeat stopped ten minutes ago, no final state: kill -9
    write_json_atomic(stale / "status.rank0.json", status)
    append_alert(logdir / "gpt" / "done", {"t": time.time(), "step": 3, "rule": "spike", "message": "x"})

    with client(logdir) as c:
        runs = {r["id"]: r for r in c.get("/api/runs").json()["runs"]}
    assert set(runs) == {"gpt/done", "gpt/broken", "bert/live", "bert/killed"}
    assert {k: r["state"] for k, r in runs.items()} == {
        "gpt/done": "finished",
        "gpt/broken": "failed",
        "bert/live": "running",
        "bert/killed": "stale",
    }
    assert runs["gpt/done"]["tags"] == {"mode": "graph"} and runs["gpt/done"]["alert_count"] == 1
    assert runs["gpt/broken"]["error"] == "RuntimeError: boom"
    assert runs["bert/live"]["last_step"] == 50 and runs["bert/live"]["project"] == "bert"
    assert "path" not in runs["gpt/done"]  # the server's file layout stays on the server


def test_run_info_has_config_tags_metrics_ranks_and_status(logdir: Path) -> None:
    make_run(logdir, "gpt", "r", ranks=2, tags={"dataset": "wiki"})
    with client(logdir) as c:
        info = c.get("/api/run", params={"run": "gpt/r"}).json()
    assert info["config"] == {"lr": 0.001} and info["tags"] == {"dataset": "wiki"}
    assert info["metrics"] == ["loss", "lr"] and info["ranks"] == [0, 1]
    assert info["status"]["state"] == "finished" and info["status"]["ranks"]["1"]["state"] == "finished"
    assert info["cursor"] == "0:0:50,1:0:50;0"


def test_downsampling_keeps_a_single_step_spike_in_100k_steps(logdir: Path) -> None:
    root = logdir / "p" / "long"
    root.mkdir(parents=True)
    n, spike, dip = 100_000, 73_457, 12_345
    rng = np.random.default_rng(0)
    loss = 2.0 + 0.01 * rng.standard_normal(n)
    loss[spike - 1], loss[dip - 1] = 50.0, -7.0
    with open(root / "metrics.rank0.jsonl", "w") as f:
        f.writelines(json.dumps({"step": s + 1, "t": 1e9 + s, "loss": float(loss[s])}) + "\n" for s in range(n))
    with client(logdir) as c:
        body = c.get("/api/series", params={"run": "p/long", "metric": "loss", "points": 500}).json()
        assert body["total"] == n and len(body["points"]) <= 500
        by_step = dict(map(tuple, body["points"]))
        assert by_step[spike] == 50.0 and by_step[dip] == -7.0
        # A zoomed window answers with every point inside it.
        win = c.get("/api/series", params={"run": "p/long", "metric": "loss", "lo": 73_400, "hi": 73_499}).json()
        assert [p[0] for p in win["points"]] == list(range(73_400, 73_500)) and win["in_window"] == 100
        # x by time: the same points keyed by their wall-clock time.
        t = c.get("/api/series", params={"run": "p/long", "metric": "loss", "x": "time", "points": 500}).json()
        assert [1e9 + spike - 1, 50.0] in t["points"]


def test_non_finite_values_are_gaps_and_markers(logdir: Path) -> None:
    root = make_run(logdir, "p", "nan", steps=5)
    RunWriter(root, 0).write([{"step": 6, "t": time.time(), "loss": math.nan}, {"step": 7, "t": time.time(), "loss": math.inf}])
    with client(logdir) as c:
        body = c.get("/api/series", params={"run": "p/nan", "metric": "loss"}).json()
    assert body["points"][-2:] == [[6, None], [7, None]]
    assert body["nonfinite"] == [[6, "nan"], [7, "inf"]]


def test_alerts_endpoint_returns_every_alert_in_order(logdir: Path) -> None:
    root = make_run(logdir, "p", "a")
    for i in range(3):
        append_alert(
            root, {"t": time.time(), "step": 10 * i, "rank": 0, "rule": "loss_spike", "metric": "loss", "value": 9.0 + i}
        )
    with client(logdir) as c:
        alerts = c.get("/api/alerts", params={"run": "p/a"}).json()["alerts"]
    assert [a["step"] for a in alerts] == [0, 10, 20] and alerts[2]["value"] == 11.0


def test_heatmap_of_attention_entropy_per_layer(logdir: Path) -> None:
    root = logdir / "p" / "h"
    root.mkdir(parents=True)
    recs = [
        {"step": s, "t": s, "attention_entropy/0": 1.0, "attention_entropy/10": 2.0, "attention_entropy/2": 3.0}
        for s in range(1, 101)
    ]
    RunWriter(root, 0).write(recs)
    with client(logdir) as c:
        d = c.get("/api/heatmap", params={"run": "p/h", "buckets": 4}).json()
    assert d["layers"] == ["attention_entropy/0", "attention_entropy/2", "attention_entropy/10"]  # natural order
    assert len(d["steps"]) == 4 and {(v[1], v[2]) for v in d["values"]} == {(0, 1.0), (1, 3.0), (2, 2.0)}


def test_a_heat_map_of_layers_measured_at_the_first_step_and_every_tenth_has_no_blank_column(logdir: Path) -> None:
    root = logdir / "p" / "every10"
    measured = [1, *range(10, 101, 10)]  # the layer watch measures the first step, then every k
    RunWriter(root, 0).write([{"step": s, "t": s, "grad_norm/a": 1.0, "grad_norm/b": 2.0} for s in measured])
    with client(logdir) as c:
        d = c.get("/api/heatmap", params={"run": "p/every10", "prefix": "grad_norm/"}).json()
    assert d["steps"] == measured  # a column per measured step
    assert sorted((v[0], v[1]) for v in d["values"]) == [(col, row) for col in range(len(measured)) for row in (0, 1)]


def test_compare_overlays_one_metric_from_several_runs(logdir: Path) -> None:
    make_run(logdir, "p", "a", steps=20)
    make_run(logdir, "p", "b", steps=30, state="failed")
    with client(logdir) as c:
        d = c.get("/api/compare", params={"runs": "p/a,p/b", "metric": "loss"}).json()
    assert [(s["run"], s["total"], s["state"]) for s in d["series"]] == [("p/a", 20, "finished"), ("p/b", 30, "failed")]


def test_compare_runs_gives_each_runs_summary_and_the_config_keys_that_differ(logdir: Path) -> None:
    import mindwatch
    from mindwatch.analysis.summary import summarize_run

    make_run(logdir, "p", "a", steps=20)
    b = make_run(logdir, "p", "b", steps=30, state="failed", error="boom")
    meta = json.loads((b / "meta.json").read_text())
    meta["config"] = {"lr": 0.01, "optimizer": {"name": "adamw"}}
    (b / "meta.json").write_text(json.dumps(meta))
    with client(logdir) as c:
        d = c.get("/api/compare/runs", params={"runs": "p/a,p/b"}).json()
        assert c.get("/api/compare/runs").status_code == 400
    keys = {k["key"]: k for k in d["config"]}
    assert keys["lr"]["differs"] and keys["lr"]["values"] == [0.001, 0.01]
    assert keys["optimizer.name"]["present"] == [False, True] and keys["optimizer.name"]["differs"]
    for run, path in zip(d["runs"], (logdir / "p" / "a", b), strict=True):
        s = summarize_run(mindwatch.open_run(path))
        assert (run["summary"]["state"], run["summary"]["last_step"], run["rank_text"]) == (s.state, s.last_step, "1")
        assert run["summary"]["best_loss"] == pytest.approx(s.best_loss) and run["metrics"] == ["loss", "lr"]
    assert [r["summary"]["best_loss"] for r in d["runs"]] == [2.0, 2.0]  # make_run: loss 3 - s/steps, least at the last step


def test_torn_last_line_is_read_once_complete_and_growth_is_picked_up(logdir: Path) -> None:
    root = make_run(logdir, "p", "grow", steps=3, state="running")
    metrics = root / "metrics.rank0.jsonl"
    with client(logdir) as c:

        def steps() -> list[int]:
            return [p[0] for p in c.get("/api/series", params={"run": "p/grow", "metric": "loss"}).json()["points"]]

        assert steps() == [1, 2, 3]
        with open(metrics, "ab") as f:
            f.write(b'{"step":4,"t":1.0,"lo')  # the writer is mid-line
        assert steps() == [1, 2, 3]
        with open(metrics, "ab") as f:
            f.write(b'ss":0.5}\n{"step":5,"t":2.0,"loss":0.4}\n')
        assert steps() == [1, 2, 3, 4, 5]
        metrics.write_text('{"step":1,"t":1.0,"loss":9.0}\n')  # replaced by a shorter file: read again from the start
        assert steps() == [1]


def reference_columns(path: Path) -> dict[str, tuple[list[int], list[float]]]:
    """What the run-directory contract says a reader gets: json.loads of every line, integer steps only."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for raw in path.read_bytes().splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(rec, dict) or type(rec.get("step")) is not int:
            continue
        for key, v in rec.items():
            if key not in ("step", "t", "rank") and (x := decode_value(v)) is not None:
                out.setdefault(key, ([], []))[0].append(rec["step"])
                out[key][1].append(x)
    return out


def test_columns_agree_with_plain_json_on_odd_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.rank0.jsonl"
    lines = [
        '{"step":1,"t":1.0,"loss":2.5,"flag":true,"phase":"train"}',
        "garbage that is not json",
        '{"step": 2, "t": 2.0, "loss": "nan", "extra": 1e-05}',
        '{"step":2.5,"loss":1.0}',
        '{"t":3.0,"loss":3.0}',
        '{"step":4,"t":4.0,"loss":"-inf","nested":{"loss":7}}',
        '{"step":5,"t":5.0,"acc@1":0.5}',
        '{"step":true,"loss":8.0}',
    ]
    path.write_text("\n".join(lines) + "\n")
    want = reference_columns(path)
    assert set(want) == {"loss", "flag", "extra", "acc@1"}
    for segment_bytes in (64, 1 << 20):  # tiny segments: every path through the segment logic
        cols = RankColumns(path, segment_bytes=segment_bytes)
        cols.refresh()
        assert cols.keys == set(want)
        for metric, (steps, values) in want.items():
            line, value = cols.column(metric)
            assert cols.steps[line].tolist() == steps, metric
            np.testing.assert_array_equal(value, values)
        run = open_run(tmp_path)  # open_run reads through the same columns
        assert run.metrics == sorted(want) and run.series("loss").step.tolist() == want["loss"][0]


def test_a_replaced_metrics_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "metrics.rank0.jsonl"
    path.write_bytes(b"".join(encode_line({"step": s, "loss": 1.0}) for s in range(1, 4)))
    cols = RankColumns(path)
    cols.refresh()
    assert cols.column("loss")[1].tolist() == [1.0] * 3
    generation = cols.generation
    new = tmp_path / "new.jsonl"
    new.write_bytes(b"".join(encode_line({"step": s, "loss": 2.0}) for s in range(10, 20)))
    os.replace(new, path)  # a longer file under the same name: only its inode tells
    cols.refresh()
    assert cols.generation > generation and cols.steps.tolist() == list(range(10, 20))
    assert cols.column("loss")[1].tolist() == [2.0] * 10


def test_traversal_and_outside_paths_are_refused(logdir: Path, tmp_path: Path) -> None:
    make_run(logdir, "p", "ok")
    outside = make_run(tmp_path / "elsewhere", "secret", "run", steps=5)
    (logdir / "p" / "linked").symlink_to(outside)  # a symlinked run directory pointing out of LOGDIR
    sneaky = make_run(logdir, "p", "sneaky", steps=2)
    (sneaky / "metrics.rank1.jsonl").symlink_to(outside / "metrics.rank0.jsonl")  # a symlinked file pointing out
    with client(logdir) as c:
        ids = [r["id"] for r in c.get("/api/runs").json()["runs"]]
        assert "p/linked" not in ids
        for bad in ["../elsewhere/secret/run", "/etc", "p/../../elsewhere/secret/run", "p/./ok", "..\\..\\etc", "p/ok\x00"]:
            r = c.get("/api/series", params={"run": bad, "metric": "loss"})
            assert r.status_code == 400, bad
            assert "Traceback" not in r.text and r.json()["error"]
        assert c.get("/api/series", params={"run": "p/linked", "metric": "loss"}).status_code == 404
        assert c.get("/api/run?run=%2e%2e%2felsewhere%2fsecret%2frun").status_code == 400  # percent-encoded ../
        assert c.get("/api/run?run=p%2f..%2f..%2fetc").status_code == 400
        info = c.get("/api/run", params={"run": "p/sneaky"}).json()
        assert info["ranks"] == [0]  # rank 1's file leads outside LOGDIR: not read
        for path in ["/static/..%2f..%2fpyproject.toml", "/static/%2e%2e%2fapp.py", "/static/runs.py", "/../pyproject.toml"]:
            r = c.get(path)
            assert r.status_code == 404 and "tool.ruff" not in r.text, path


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"metric": "loss", "points": "abc"}, "points must be an integer"),
        ({"metric": "loss", "points": "5"}, "points must be between 10"),
        ({"metric": "loss", "rank": "-1"}, "rank must be between"),
        ({"metric": "loss", "rank": "7"}, "rank 7 has no metrics"),
        ({"metric": "loss", "x": "epoch"}, "x must be one of step, time"),
        ({"metric": "loss", "lo": "nan"}, "lo must be a finite number"),
        ({"metric": "loss", "hi": "ten"}, "hi must be a number"),
        ({}, "metric is required"),
        ({"metric": "<script>"}, "is not a metric name"),
    ],
)
def test_bad_query_values_get_400_with_a_message(logdir: Path, query: dict[str, str], message: str) -> None:
    make_run(logdir, "p", "r")
    with client(logdir) as c:
        r = c.get("/api/series", params={"run": "p/r", **query})
    assert r.status_code == 400 and message in r.json()["error"] and "Traceback" not in r.text


def test_other_bad_requests(logdir: Path) -> None:
    make_run(logdir, "p", "r")
    with client(logdir) as c:
        assert c.get("/api/run").status_code == 400
        assert c.get("/api/run", params={"run": "p/none"}).status_code == 404
        assert c.get("/api/live", params={"run": "p/r", "cursor": "x;y"}).status_code == 400
        assert c.get("/api/live", params={"run": "p/r", "cursor": "0:0:-1;0"}).status_code == 400
        assert c.get("/api/compare", params={"runs": ",".join(["p/r"] * 13), "metric": "loss"}).status_code == 400
        assert c.get("/api/heatmap", params={"run": "p/r", "buckets": "0"}).status_code == 400


def test_token_is_required_by_header_or_login_cookie(logdir: Path) -> None:
    make_run(logdir, "p", "r")
    token = "s3cret-token-123"
    with client(logdir, token=token) as c:
        assert c.get("/api/runs").status_code == 401
        assert c.get("/api/runs", headers={"Authorization": "Bearer wrong-token-xx"}).status_code == 401
        assert c.get("/api/runs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        page = c.get("/", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/login"
        assert "token" in c.get("/login").text
        assert c.post("/login", data={"token": "nope-nope-nope"}, follow_redirects=False).status_code == 401
        r = c.post("/login", data={"token": token}, follow_redirects=False)
        assert r.status_code == 303 and "HttpOnly" in r.headers["set-cookie"]
        assert c.get("/api/runs").status_code == 200  # the cookie from the form is enough
        assert "mindwatch" in c.get("/").text
    with client(logdir) as c:  # no token configured (loopback): open
        assert c.get("/api/runs").status_code == 200


def test_exposed_host_needs_a_token() -> None:
    check_binding("127.0.0.1", None)
    check_binding("::1", None)
    check_binding("0.0.0.0", "s3cret-token-123")
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.org"):
        with pytest.raises(SystemExit, match="refusing to listen on"):
            check_binding(host, None)


def test_serve_refuses_non_loopback_without_token_from_the_command_line(logdir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MINDWATCH_TOKEN"}
    r = subprocess.run(
        [sys.executable, "-m", "mindwatch.cli", "serve", str(logdir), "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode != 0 and "refusing to listen on 0.0.0.0 without a token" in r.stderr


def test_serve_started_before_the_training_made_its_save_dir_lists_the_runs_that_appear(tmp_path: Path) -> None:
    logdir = tmp_path / "monitor_output"  # the training has not started yet
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MINDWATCH_TOKEN"}
    cmd = [sys.executable, "-m", "mindwatch.cli", "serve", str(logdir), "--port", str(port), "--no-cache"]
    with open(tmp_path / "serve.err", "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)

    def listed() -> list[str]:
        assert proc.poll() is None, f"mindwatch serve exited: {(tmp_path / 'serve.err').read_text()}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=2) as r:
            return [row["id"] for row in json.load(r)["runs"]]

    try:
        wait_for(lambda: listed() == [], 30, "the dashboard to answer, with no run", transient=(OSError,))
        said = (tmp_path / "serve.err").read_text()
        assert said.count("does not exist yet") == 1, said
        assert f"{logdir.resolve()} does not exist yet; its runs will show as soon as they appear there" in said
        make_run(logdir, "gpt", "late", state="running")  # the training makes its save_dir and its run
        wait_for(lambda: listed() == ["gpt/late"], 10, "the new run on /api/runs")
    finally:
        proc.terminate()
        proc.wait(10)
    assert (tmp_path / "serve.err").read_text().count("does not exist yet") == 1  # said once


def test_the_server_never_imports_mindspore(logdir: Path) -> None:
    make_run(logdir, "p", "r")
    code = f"""
import sys
from starlette.testclient import TestClient
from mindwatch.serve.app import create_app
with TestClient(create_app({str(logdir)!r})) as c:
    assert c.get("/api/runs").status_code == 200
    assert c.get("/api/series", params={{"run": "p/r", "metric": "loss"}}).status_code == 200
    assert c.get("/").status_code == 200
import mindwatch.cli
mindwatch.cli.build_parser().parse_args(["serve", "x"])
bad = sorted(m for m in sys.modules if m.split(".")[0] == "mindspore")
print("MINDSPORE_MODULES", bad)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "MINDSPORE_MODULES []" in r.stdout


def test_static_files_and_echarts_are_served_locally(logdir: Path) -> None:
    with client(logdir) as c:
        page = c.get("/")
        assert page.status_code == 200 and "/static/echarts.min.js" in page.text and "http" not in page.text.split("<body>")[1]
        assert 't.version="6.' in c.get("/static/echarts.min.js").text  # the npm copy, served by us
        assert "MWCharts" in c.get("/static/charts.js").text
        assert c.get("/").headers["x-content-type-options"] == "nosniff"


def test_band_across_ranks_gives_min_mean_max_per_step(logdir: Path) -> None:
    make_run(logdir, "p", "ddp", steps=40, ranks=3)  # rank r's loss is (3 - s/40) + r
    with client(logdir) as c:
        assert c.get("/api/run", params={"run": "p/ddp"}).json()["band_metrics"][0] == "loss"
        b = c.get("/api/band", params={"run": "p/ddp", "metric": "loss", "points": 20}).json()
    assert b["ranks"] == [0, 1, 2] and len(b["points"]) <= 20
    for step, lo, mean, hi in b["points"]:
        base = 3.0 - step / 40
        assert (lo, mean, hi) == pytest.approx((base, base + 1, base + 2))


def test_column_cache_lets_a_new_server_continue_without_rereading(tmp_path: Path) -> None:
    from mindwatch.store.cache import ColumnCache

    path = tmp_path / "metrics.rank0.jsonl"
    lines = [{"step": s, "t": float(s), "loss": 1.0 / s} for s in range(1, 3001)]
    lines[10]["loss"] = math.nan
    for rec in lines[::7]:
        rec["grad_norm"] = 2.0  # a sparse metric: its line numbers are kept
    path.write_bytes(b"".join(encode_line(r) for r in lines) + b"garbage\n")
    cache = ColumnCache(tmp_path / "cache", min_lines=1000)
    first = RankColumns(path, segment_bytes=4096, cache=cache)
    first.refresh()
    for metric in ("loss", "grad_norm"):
        first.column(metric)
    first.keys  # noqa: B018 (found lazily; the next save keeps them)
    cache.save(first, wait=True)
    cache.join()
    assert not first.from_cache and list((tmp_path / "cache").glob("*.npz"))

    second = RankColumns(path, cache=cache)  # a restarted server
    assert second.from_cache and second.lines == 3000 and second.keys == {"loss", "grad_norm"}
    for metric in ("loss", "grad_norm", "t"):
        for a, b in zip(first.column(metric), second.column(metric), strict=True):
            np.testing.assert_array_equal(a, b)
    with open(path, "ab") as f:
        f.write(encode_line({"step": 3001, "t": 3001.0, "loss": 0.5}))
    assert second.refresh() == 1 and second.column("loss")[1][-1] == 0.5

    path.write_bytes(path.read_bytes().replace(b'"step":1,', b'"step":9,', 1))  # same size, other content
    third = RankColumns(path, cache=cache)
    assert not third.from_cache  # a changed file is read again, never served from the cache
    third.refresh()
    assert third.steps[0] == 9


def test_every_front_end_module_is_served() -> None:
    from mindwatch.serve import app

    static = Path(app.__file__).parent / "static"
    assert {p.name for p in static.iterdir() if p.suffix in (".js", ".css", ".html")} == set(app.STATIC_FILES)
