"""The ``profile`` action as a person sees it: one real training (GRAPH, its batches paced), on whose run page a person
asks for a profile with the Profile button (``mindwatch serve --allow-control``, the token) and watches it come. Then the
profile's summary on the run page (the top op types, the step times), its trace downloaded, the alerts that asked linked
to it, the API's refusals and the report's Profiles section. Every value shown is held to what
``open_run(path).profiles`` and the run's own ``step_time`` series say."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from conftest import CHROMIUM, wait_for
from starlette.testclient import TestClient
from test_dashboard_control_browser import TOKEN, serve, status
from test_report import open_page

import mindwatch
from mindwatch.report.html import write_report
from mindwatch.serve.app import create_app
from mindwatch.serve.process import DashboardProcess
from mindwatch.store.profiles import Profile, step_times
from mindwatch.store.reader import Run

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = [
    pytest.mark.slow,  # one paced training shared by the module (~10 s), a dashboard and Chromium
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} is not installed"),
]

RUN_ID = "p/profiled"
STEPS_ASKED = 3
REASON = "slow steps, seen from the browser"
PACE = 0.05  # s a batch: the data pipeline is slower than the step, so the run lasts long enough to act on
ASK_AFTER = 22  # steps: the profile's 20 steps before it are past the compile step
MOST_STEPS = 2000


@dataclass
class Asked:
    """What the person saw asking for a profile from the run page while the run trained."""

    run: Run
    url: str  # the dashboard: --allow-control, TOKEN
    default_steps: str  # the steps field before they typed
    answer: str  # what the page said once the training took the request
    live_states: list[str]  # the profile's state as the page showed it, first to last
    rebuilt: bool  # whether the page had drawn its charts again by the time it showed the profile


def train(logdir: Path, failed: list[BaseException]) -> None:
    """A small MLP regression (GRAPH, Adam) whose batches come ``PACE`` s apart, ended a few steps after a profile's last
    step (its note no longer says ``profiling``: the run ends ``stopped``, by the training loop). In a thread of this
    process: the browser stays on the main thread."""
    try:
        import mindspore as ms
        from mindspore import dataset as ds
        from mindspore import nn
        from mindspore.train import Callback, Model

        from mindwatch.mindspore import MonitorCallback

        class PacedBatches:
            def __len__(self) -> int:
                return MOST_STEPS

            def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
                time.sleep(PACE)
                x = np.random.default_rng(i).standard_normal((8, 16)).astype(np.float32)
                return x, x.sum(axis=1, keepdims=True)

        class StopAfterProfile(Callback):
            def __init__(self, run_dir: Path) -> None:
                self.run_dir, self.stop_at = run_dir, None

            def on_train_step_end(self, run_context: Any) -> None:
                step = run_context.original_args().cur_step_num
                if self.stop_at is None:
                    notes = [json.loads(p.read_text()) for p in self.run_dir.glob("profiles/step_*/rank0/profile.json")]
                    self.stop_at = step + 5 if any(n["state"] != "profiling" for n in notes) else None
                elif step >= self.stop_at:
                    run_context.request_stop()

        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_seed(0)
        net = nn.SequentialCell(nn.Dense(16, 64), nn.ReLU(), nn.Dense(64, 1))
        model = Model(net, nn.MSELoss(), nn.Adam(net.trainable_params(), 1e-3))
        monitor = MonitorCallback({"save_dir": str(logdir), "project": "p", "run_name": "profiled", "interval": 60})
        data = ds.GeneratorDataset(PacedBatches(), ["x", "y"], shuffle=False)
        model.train(1, data, callbacks=[monitor, StopAfterProfile(logdir / RUN_ID)], dataset_sink_mode=False)
    except BaseException as e:  # the fixture raises it
        failed.append(e)


@pytest.fixture(scope="module")
def asked(tmp_path_factory: pytest.TempPathFactory, chromium: Browser) -> Iterator[Asked]:
    """The run page of a live training; its Profile button clicked with 3 steps and a reason; the page watched until the
    run ended and its profile showed ``done``."""
    logdir = tmp_path_factory.mktemp("profiles")
    run_dir = logdir / RUN_ID
    server, url = serve(logdir, "--allow-control")
    failed: list[BaseException] = []
    training = threading.Thread(target=train, args=(logdir, failed), name="training", daemon=True)
    training.start()
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.on("dialog", lambda d: d.accept())  # the button's "profile the next steps: 3 on p/profiled?"
        page.goto(f"{url}/?token={TOKEN}")  # the printed sign-in link sets the cookie
        wait_for(lambda: failed or (status(run_dir).get("last_step") or 0) >= ASK_AFTER, 120, "the training's steps")
        assert not failed, failed
        page.goto(f"{url}/#/run/{quote(RUN_ID, safe='')}")
        button = page.locator('.run-actions button[data-action="profile"]')
        button.wait_for(state="visible", timeout=30_000)
        page.wait_for_selector("#chart-loss", timeout=30_000)
        page.evaluate("() => { window.drawnBefore = document.querySelector('#charts > .card'); }")
        default_steps = page.input_value(".run-actions-steps")
        page.fill(".run-actions-steps", str(STEPS_ASKED))
        page.fill(".run-actions-reason", REASON)
        button.click()
        page.wait_for_function("() => document.querySelector('.run-actions-note').textContent.includes('taken')", timeout=60_000)
        answer = page.text_content(".run-actions-note") or ""
        # the profile comes on the page as it is (recorded, analysed, done) by the live stream: the charts drawn before
        # the click are still the page's (a reload, or a rebuild of the page, would have drawn new ones)
        shown = lambda: page.text_content("#profiles .profile-state")  # noqa: E731
        live_states = [wait_for(shown, 30, "the profile on the page")]
        rebuilt = page.evaluate("() => document.querySelector('#charts > .card') !== window.drawnBefore")
        training.join(120)
        assert not training.is_alive() and not failed, failed
        while live_states[-1] != "done":  # the run's end waits for MindSpore's analysis
            live_states.append(wait_for(lambda: (s := shown()) != live_states[-1] and s, 30, "the profile's next state"))
        yield Asked(mindwatch.open_run(run_dir), url, default_steps, answer, live_states, rebuilt)
    finally:
        context.close()
        server.kill()
        training.join(60)


def shown_profile(run: Run) -> Profile:
    (profile,) = run.profiles
    return profile


def signed_in_page(browser: Browser, url: str) -> Page:
    page = browser.new_context().new_page()
    page.goto(f"{url}/?token={TOKEN}")
    return page


# -- the Profile button -----------------------------------------------------------------------------------------------
def test_the_profile_button_files_a_profile_request_of_the_steps_asked_and_the_page_shows_it_taken_then_listed_live(
    asked: Asked,
) -> None:
    profile = shown_profile(asked.run)
    requests = [json.loads(p.read_text()) for p in sorted((asked.run.path / "control" / "requests").glob("*.json"))]
    (request,) = requests
    assert (request["action"], request["steps"], request["reason"]) == ("profile", STEPS_ASKED, REASON)
    assert request["requested_by"].endswith("(dashboard, from 127.0.0.1)")
    assert asked.default_steps == "", "the field starts empty: the run's own profile.steps"
    # the answer names the first profiled step, the one the profile's folder and note have
    assert asked.answer == f"profile: taken at step {profile.first_step}"
    assert (profile.steps, profile.note.rule, profile.reason) == (STEPS_ASKED, "request", REASON)
    assert profile.note.requested_by == request["requested_by"]
    # listed while it was still recorded or analysed, then done, on the page the person had open
    assert asked.live_states[0] in ("profiling", "analysing", "done") and asked.live_states[-1] == "done", asked.live_states
    assert not asked.rebuilt, "the profile came with the live stream, not with a rebuild of the page"


# -- the run page ----------------------------------------------------------------------------------------------------
# the summary table of the profile from step ``first``, on the run page and in the report alike
ROWS = """(first) => [...document.querySelectorAll(`table.profile-ops[data-first-step="${first}"] tbody tr`)].map((tr) => [
  tr.dataset.op, [...tr.querySelectorAll('td[data-rank]')].map((td) => [Number(td.dataset.rank), Number(td.dataset.ms)])])"""
TIMES = """(first) => Object.fromEntries(
  [...document.querySelectorAll(`table.profile-ops[data-first-step="${first}"] tr[data-times]`)].map((tr) => [
    tr.dataset.times,
    [...tr.querySelectorAll('td')].map((td) => (td.dataset.value === '' ? null : Number(td.dataset.value))),
  ]))"""


def assert_times(shown: dict[str, list[float | None]], run: Run, profile: Profile) -> None:
    """``shown`` (each rank's profiled, before, ratio) are the step times the reader gives: the run's own ``step_time``
    series through ``store.profiles.step_times``."""
    series = run.series("step_time", rank=0)
    t = step_times(profile, series.step, series.value)
    assert t.profiled and t.before and t.ratio, t
    assert sorted(shown) == ["before", "during", "ratio"]
    assert (shown["during"], shown["before"], shown["ratio"]) == (
        [pytest.approx(t.profiled)],
        [pytest.approx(t.before)],
        [pytest.approx(t.ratio)],
    )


def test_the_run_page_lists_the_profile_with_its_top_op_types_and_step_times_links_its_alerts_and_downloads_its_trace(
    asked: Asked, browser: Browser
) -> None:
    profile = shown_profile(asked.run)
    rank = profile.ranks[0]
    first = profile.first_step
    page = signed_in_page(browser, asked.url)
    page.goto(f"{asked.url}/#/run/{quote(RUN_ID, safe='')}")
    page.wait_for_selector(f"#profile-{first} table.profile-ops tbody tr", timeout=30_000)
    head = page.text_content(f"#profile-{first} summary") or ""
    assert f"steps {first}–{profile.last_step}" in head and "rank 0" in head and "done" in head, head
    assert f"asked by {profile.note.requested_by}: {REASON}" in head, head
    # the top op types, as MindSpore's op statistics give them, each with rank 0's time
    rows = page.evaluate(ROWS, first)
    assert rows == [[op.op_type, [[0, op.total_ms]]] for op in rank.top_ops] and len(rows) >= 5, rows
    assert_times(page.evaluate(TIMES, first), asked.run, profile)
    assert page.locator(f"#profile-{first} td.most").count() == 0, "one rank: no rank to stand out against"
    folder = page.text_content(f"#profile-{first} .profile-folder")
    assert rank.folder is not None and folder == rank.folder.relative_to(asked.run.path).as_posix()

    # the alerts that asked (the request) and reported it (the intervention) link it; a click opens it
    links = page.locator(f'#alert-list .profile-link[data-first-step="{first}"]')
    assert links.count() == 2
    page.click(f"#profile-{first} summary")  # folded
    assert not page.evaluate(f"() => document.getElementById('profile-{first}').open")
    links.first.click()
    assert page.evaluate(f"() => document.getElementById('profile-{first}').open")

    # the trace: the file on disk, named after the run, the step and the rank
    with page.expect_download() as download:
        page.click(f'#profile-{first} li[data-rank="0"] a.profile-trace')
    assert download.value.suggested_filename == f"p_profiled_step{first}_rank0_trace_view.json"
    assert rank.trace is not None and Path(download.value.path()).read_bytes() == rank.trace.read_bytes()


# -- the API ---------------------------------------------------------------------------------------------------------
def test_the_api_serves_the_profiles_as_the_reader_reads_them_and_no_file_outside_the_run(asked: Asked, tmp_path: Path) -> None:
    profile = shown_profile(asked.run)
    rank = profile.ranks[0]
    first = profile.first_step
    api = httpx.Client(base_url=asked.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    (served,) = api.get("/api/profiles", params={"run": RUN_ID}).json()["profiles"]
    assert (served["first_step"], served["last_step"], served["steps"], served["ranks"]) == (first, first + 2, 3, [0])
    assert (served["reason"], served["rule"], served["state"]) == (REASON, "request", "done")
    (part,) = served["rank_parts"]
    assert part.pop("top_ops") == [vars(op) for op in rank.top_ops]
    folder = f"profiles/step_{first}/rank0/{rank.folder.name}"
    assert part == {"rank": 0, "state": "done", "error": None, "folder": folder, "trace": True}
    assert [(o["op_type"], o["ms"], o["share"]) for o in served["ops"]] == [
        (o.op_type, [o.total_ms], [o.share]) for o in rank.top_ops
    ]
    assert_times({k: [t[k] for t in served["step_times"]] for k in ("during", "before", "ratio")}, asked.run, profile)

    trace = api.get("/api/profile-trace", params={"run": RUN_ID, "step": first, "rank": 0})
    assert trace.status_code == 200 and trace.content == rank.trace.read_bytes()
    assert trace.headers["content-disposition"] == f'attachment; filename="p_profiled_step{first}_rank0_trace_view.json"'
    for params, code in [
        ({"step": "../x", "rank": 0}, 400),
        ({"step": first, "rank": "../0"}, 400),
        ({"step": f"{first}/../../meta.json", "rank": 0}, 400),
        ({"step": first + 1, "rank": 0}, 404),
        ({"step": first, "rank": 1}, 404),
        ({"run": "p/../p/profiled", "step": first, "rank": 0}, 400),
    ]:
        r = api.get("/api/profile-trace", params={"run": RUN_ID, **params})
        assert r.status_code == code, (params, r.text)
        assert r.headers["content-type"].startswith("application/json") and "error" in r.json()

    # a run whose trace is a link to a file outside the log directory: not served, not listed as there
    logdir = tmp_path / "logdir"
    copy = logdir / "p" / "linked"
    shutil.copytree(asked.run.path, copy)
    outside = tmp_path / "outside.json"
    outside.write_text('{"secret": 1}')
    linked = copy / rank.trace.relative_to(asked.run.path)
    linked.unlink()
    linked.symlink_to(outside)
    with TestClient(create_app(logdir)) as local:
        r = local.get("/api/profile-trace", params={"run": "p/linked", "step": first, "rank": 0})
        assert r.status_code == 404 and b"secret" not in r.content
        (listed,) = local.get("/api/profiles", params={"run": "p/linked"}).json()["profiles"]
        assert listed["rank_parts"][0]["trace"] is False


# -- two ranks side by side ------------------------------------------------------------------------------------------
def with_a_slower_rank(run: Run, logdir: Path) -> tuple[Path, str]:
    """A copy of the run whose profile has a rank 1 too: rank 0's files, its note saying rank 1, and MindSpore's op
    statistics with the longest op type's time doubled. Returns the copy and that op type."""
    copy = logdir / "p" / "two_ranks"
    shutil.copytree(run.path, copy)
    step_dir = copy / "profiles" / f"step_{shown_profile(run).first_step}"
    shutil.copytree(step_dir / "rank0", step_dir / "rank1")
    note = json.loads((step_dir / "rank1" / "profile.json").read_text())
    (step_dir / "rank1" / "profile.json").write_text(json.dumps({**note, "rank": 1}))
    (stats,) = (step_dir / "rank1").glob("*_ascend_ms/FRAMEWORK/cpu_op_type_info_*.csv")
    top = shown_profile(run).ranks[0].top_ops[0].op_type
    lines = stats.read_text().splitlines()
    header = lines[0].split(",")
    at = header.index("total_compute_time")
    for i, line in enumerate(lines[1:], 1):
        cells = line.split(",")
        if cells[0] == top:
            cells[at] = str(2 * float(cells[at]))
            lines[i] = ",".join(cells)
    stats.write_text("\n".join(lines) + "\n")
    return copy, top


def test_with_two_ranks_the_page_and_the_report_put_them_side_by_side_and_mark_the_rank_that_spent_the_most(
    asked: Asked, browser: Browser, tmp_path: Path
) -> None:
    copy, top = with_a_slower_rank(asked.run, tmp_path / "logdir")
    run = mindwatch.open_run(copy)
    profile = shown_profile(run)
    first = profile.first_step
    assert sorted(profile.ranks) == [0, 1]
    expected = {(op.op_type, r): op.total_ms for r in (0, 1) for op in profile.ranks[r].top_ops if op.op_type in {"Adam", top}}
    most = f"""() => [...document.querySelectorAll('table.profile-ops[data-first-step="{first}"] td.most')].map((td) =>
      [td.closest('tr').dataset.op, Number(td.dataset.rank)])"""
    with DashboardProcess(tmp_path / "logdir", port=0) as dash:
        page = browser.new_page()
        page.goto(f"{dash.url}#/run/{quote('p/two_ranks', safe='')}")
        page.wait_for_selector(f"#profile-{first} table.profile-ops tbody tr", timeout=30_000)
        rows = dict(page.evaluate(ROWS, first))
        # the doubled op type, marked on rank 1; every other op type the same on both: none marked
        assert page.evaluate(most) == [[top, 1]]
        assert {(op, r): ms for op, cells in rows.items() for r, ms in cells if op in {"Adam", top}} == expected
        assert "ranks 0–1" in (page.text_content(f"#profile-{first} summary") or "")
    (out,) = write_report([run], tmp_path / "report.html")
    page, problems, requests = open_page(browser, out)
    assert page.evaluate(most) == [[top, 1]]
    assert dict(page.evaluate(ROWS, first))[top] == [[0, expected[(top, 0)]], [1, expected[(top, 1)]]]
    assert problems == [] and requests == []


# -- the report ------------------------------------------------------------------------------------------------------
def test_the_report_lists_the_profile_with_the_readers_top_op_types_and_step_times(
    asked: Asked, browser: Browser, tmp_path: Path
) -> None:
    profile = shown_profile(asked.run)
    first = profile.first_step
    (out,) = write_report([asked.run], tmp_path / "report.html")
    page, problems, requests = open_page(browser, out)
    assert page.text_content(f"h3#profile-{first}") == f"steps {first}–{profile.last_step}"
    said = page.evaluate(f"() => document.getElementById('profile-{first}').nextElementSibling.textContent")
    assert said == f"rank 0 · done · asked by {profile.note.requested_by}: {REASON}"
    assert page.evaluate(ROWS, first) == [[op.op_type, [[0, op.total_ms]]] for op in profile.ranks[0].top_ops]
    assert_times(page.evaluate(TIMES, first), asked.run, profile)
    folder = page.text_content(".profile-files li[data-rank='0'] code")
    assert folder == profile.ranks[0].folder.relative_to(asked.run.path).as_posix()
    assert problems == [] and requests == []
