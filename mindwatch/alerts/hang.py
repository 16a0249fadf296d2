"""Hang diagnosis: from each rank's stack dump, which ranks wait in the training step and which one is elsewhere.

Example::

    from mindwatch.alerts.hang import diagnose

    d = diagnose({0: "stacks/stall_rank0_20261129_080102.txt", 1: "stacks/stall_rank1_20261129_080102.txt"})
    d.culprits        # [1]: not in the training step (e.g. blocked in its data pipeline)
    d.waiting         # [0]: inside the training step, i.e. waiting in a collective
    d.message         # the sentence the alert carries

    d = diagnose_run("monitor_output/gpt/run_20261129_080440")   # the same from a run directory, offline
    d = diagnose_run("node0/gpt/run_1", also=["node1/gpt/run_1"])  # every node's folder of the run, read as one

In data-parallel training every step ends in a collective (the gradient AllReduce). When one
rank stops reaching it, every other rank blocks inside the compiled step; the rank the others
wait for is the one whose main thread is somewhere else: in the dataset iterator, in a callback,
in user code. This is what PyTorch's flight recorder tells for NCCL, read here from Python stacks
(``sys._current_frames()``, written by the stall watchdog into ``stacks/``): the graph's C++ frames
are not visible, the Python frame that entered the graph is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field

from mindwatch.schema import RuleSettings
from mindwatch.store.layout import RunLayout


class HangSettings(RuleSettings):
    """When the run stalls, rank 0 reads every rank's stack dump and names the rank the others wait for."""

    #: Seconds rank 0 waits for the other ranks' stack dumps after the first stall before it diagnoses.
    wait: float = Field(default=10.0, gt=0)


#: Where a rank's main thread is.
IN_STEP, IN_DATA, IN_PYTHON, UNKNOWN = "step", "data", "python", "unknown"

_THREAD = re.compile(r"^--- thread (\d+): (.*?)( \(the watchdog itself\))?$", re.M)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$', re.M)

# A main thread inside one of these is running the training step: the compiled graph (GRAPH mode,
# ``_exec_pip`` -> the C++ graph executor; ``mindspore/common/api.py`` in older MindSpore) or,
# in PyNative mode, the ops and collectives of the step.
_STEP_FILES = ("mindspore/graph/api.py", "mindspore/common/api.py", "mindspore/ops/", "mindspore/communication/")
_STEP_FUNCS = ("_exec_pip", "_graph_executor", "compile_and_run", "run_graph")
_DATA_FILES = ("mindspore/dataset/", "mindspore/train/dataset_helper.py")
_SITE = ("/site-packages/", "/dist-packages/", "/lib/python3")
# mindwatch's own frames (the callback, the watchdog), installed or a checkout: its modules by name, so that code
# which merely lives in a folder called mindwatch (a user's project, this repository's tests) is not taken for it
_OWN = re.compile(
    r"(?:^|/)mindwatch/(?:{})(?:/|$)".format(
        "|".join(re.escape(p.name) for p in Path(__file__).resolve().parents[1].iterdir() if p.name != "__pycache__")
    )
)


def _is_library(path: str) -> bool:
    """A frame of Python's, an installed package's or mindwatch's own, not the training's code."""
    path = path.replace("\\", "/")
    return any(p in path for p in _SITE) or _OWN.search(path) is not None


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{Path(self.file).name}:{self.line} in {self.func}"


@dataclass
class Thread:
    ident: int
    name: str
    frames: list[Frame]  # outermost first, as traceback prints them
    is_watchdog: bool = False


@dataclass
class RankPlace:
    """Where one rank was when it stalled."""

    rank: int
    where: str  # IN_STEP | IN_DATA | IN_PYTHON | UNKNOWN
    detail: str
    stacks: str | None = None

    @property
    def description(self) -> str:
        return {
            IN_STEP: "inside the training step (waiting in a collective such as AllReduce)",
            IN_DATA: "waiting for its data pipeline",
            IN_PYTHON: "in Python code outside the training step",
            UNKNOWN: "somewhere unknown",
        }[self.where] + (f": {self.detail}" if self.detail else "")


@dataclass
class Diagnosis:
    places: dict[int, RankPlace]
    culprits: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    message: str = ""
    #: The message's parts: the verdict, then one line per rank.
    lines: list[str] = field(default_factory=list)
    #: Ranks without a dump whose files are not in the folders read (another node's): no verdict without them.
    not_found: list[int] = field(default_factory=list)


def parse_stacks(text: str) -> list[Thread]:
    """The threads of a stack dump written by :func:`mindwatch.monitor.watchdog.dump_stacks`."""
    heads = list(_THREAD.finditer(text))
    threads = []
    for i, m in enumerate(heads):
        body = text[m.end() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        frames = [Frame(f, int(n), fn.strip()) for f, n, fn in _FRAME.findall(body)]
        threads.append(Thread(int(m.group(1)), m.group(2), frames, bool(m.group(3))))
    return threads


def locate(rank: int, text: str, stacks: str | None = None) -> RankPlace:
    """Classify a rank from its stack dump: in the step, in the data pipeline, in Python code, or unknown."""
    threads = parse_stacks(text)
    main = next((t for t in threads if t.name == "MainThread"), None)
    if main is None or not main.frames:
        return RankPlace(rank, UNKNOWN, "no main-thread stack in the dump", stacks)
    frames = main.frames
    files = [f.file.replace("\\", "/") for f in frames]
    # innermost first: the first recognisable frame from the inside decides
    for f, path in zip(reversed(frames), reversed(files), strict=True):
        if any(p in path for p in _DATA_FILES):
            return RankPlace(rank, IN_DATA, _data_detail(f, threads), stacks)
        if any(p in path for p in _STEP_FILES) or f.func in _STEP_FUNCS:
            return RankPlace(rank, IN_STEP, _step_detail(f, frames), stacks)
        if not _is_library(path):
            return RankPlace(rank, IN_PYTHON, f"main thread at {f}", stacks)
    return RankPlace(rank, IN_PYTHON, f"main thread at {frames[-1]}", stacks)


def _step_detail(frame: Frame, frames: list[Frame]) -> str:
    """The step frame, plus the network code it came from in PyNative mode (GRAPH mode has none: it is compiled)."""
    inside = False
    caller = None
    for f in frames:  # outermost first: code that runs after the first library frame is inside the step
        lib = any(p in f.file.replace("\\", "/") for p in _SITE)
        inside = inside or lib
        if inside and not lib:
            caller = f
    return f"{frame}, called from {caller}" if caller is not None else str(frame)


def _data_detail(frame: Frame, threads: list[Thread]) -> str:
    """The main thread's dataset frame, plus where the dataset's own Python code (a generator) is."""
    parts = [f"main thread at {frame}"]
    for t in threads:
        if t.name == "MainThread" or t.is_watchdog or not t.frames:
            continue
        user = [f for f in t.frames if not _is_library(f.file)]
        if user and any("mindspore/dataset/" in f.file.replace("\\", "/") for f in t.frames):
            parts.append(f"dataset code at {user[-1]}")
    return ", ".join(parts)


def diagnose(
    dumps: Mapping[int, str | Path],
    world_size: int | None = None,
    last_steps: dict[int, int | None] | None = None,
    unseen: Collection[int] = (),
) -> Diagnosis:
    """Read each rank's stack dump and say which ranks the others wait for (see the module docstring).

    ``dumps`` maps rank -> dump file; ranks of ``range(world_size)`` without a dump are named as
    missing (a dead or wedged process writes none). ``last_steps`` (from the status files) names
    ranks that are behind. ``unseen``: ranks none of whose files were in the folders read (another
    node's folder): a dump missing there says nothing of the rank, so no verdict is given without it.
    """
    places: dict[int, RankPlace] = {}
    for rank, path in sorted(dumps.items()):
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            places[rank] = RankPlace(rank, UNKNOWN, f"cannot read {path}: {e}", str(path))
            continue
        places[rank] = locate(rank, text, str(path))
    ranks = list(range(world_size)) if world_size else sorted(places)
    missing = [r for r in ranks if r not in places]
    not_found = [r for r in missing if r in unseen]
    waiting = [r for r in ranks if r in places and places[r].where == IN_STEP]
    elsewhere = [r for r in ranks if r in places and places[r].where != IN_STEP]
    steps = {r: s for r, s in (last_steps or {}).items() if isinstance(s, int)}
    behind = [r for r in ranks if steps and r in steps and steps[r] < max(steps.values())]

    lines = []
    if not_found:
        culprits = []
        lines.append(f"no verdict: no stack dump found for {_ranks(not_found)}, whose files are not in the folders read")
    elif elsewhere and waiting:
        culprits = elsewhere
        lines.append(f"likely culprit: {_ranks(elsewhere)}, which the others wait for")
    elif missing and waiting:
        culprits = missing
        lines.append(f"likely culprit: {_ranks(missing)}, which wrote no stack dump (dead or wedged) while the others wait")
    elif behind:
        culprits = behind
        lines.append(f"likely culprit: {_ranks(behind)}, behind the others")
    else:
        culprits = []
        if not places:
            lines.append("no rank wrote a stack dump")
        elif waiting and not elsewhere:
            lines.append("every rank is inside the training step: a collective or the device itself is stuck")
        else:
            lines.append("no rank is inside the training step: each one is stuck on its own")
    for r in ranks:
        if r in places:
            lines.append(f"rank {r}: {places[r].description}")
        elif r in unseen:
            lines.append(f"rank {r}: no stack dump found (none of its files is in the folders read)")
        else:
            lines.append(f"rank {r}: no stack dump")
    if behind and culprits is not behind:
        lines.append(f"{_ranks(behind)} behind at step {min(steps[r] for r in behind)} (others at {max(steps.values())})")
    return Diagnosis(places, culprits, waiting, "; ".join(lines), lines, not_found)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


_DUMP = re.compile(r"^stall_rank(\d+)_.*(?<!\.faulthandler)\.txt$")


def diagnose_run(run_dir: str | os.PathLike[str], also: Sequence[str | os.PathLike[str]] = ()) -> Diagnosis:
    """:func:`diagnose` from a run directory: each rank's newest ``stacks/stall_rank<R>_*.txt``, the world size
    from ``meta.json`` (else the rank files) and the last steps from the status files. Works on any machine,
    also when rank 0 (which diagnoses live) is the process that died.

    ``also``: the run's folders on the other nodes (a multi-node job without a shared file system), read with
    ``run_dir`` as one run (:class:`~mindwatch.store.layout.RunLayout`); a rank with no file in any of them is
    named as not found, not as the culprit."""
    from mindwatch.store.layout import read_json

    layout = RunLayout(Path(run_dir), tuple(Path(p) for p in also))
    newest = newest_dumps(layout)
    world = (read_json(layout.meta) or {}).get("world_size")
    ranks = set(layout.ranks()) | set(newest)
    world_size = world if isinstance(world, int) and world > 0 else (max(ranks) + 1 if ranks else None)
    last_steps = {r: (read_json(layout.status(r)) or {}).get("last_step") for r in range(world_size or 0)}
    unseen = [r for r in range(world_size or 0) if r not in ranks]
    return diagnose(newest, world_size, last_steps, unseen)


def newest_dumps(layout: RunLayout) -> dict[int, Path]:
    """Each rank's newest stall dump in the run's ``stacks/`` folders (every node's: ``layout.roots``)."""
    found = [dump for root in layout.roots for dump in _dumps_in(RunLayout(root).stacks)]
    newest: dict[int, Path] = {}
    for rank, path in sorted(found, key=lambda d: d[1].stat().st_mtime):
        newest[rank] = path
    return newest


def _dumps_in(stacks: Path) -> list[tuple[int, Path]]:
    """``(rank, path)`` of each stall dump in a ``stacks/`` folder (not their ``.faulthandler.txt`` twins); an empty
    file is no dump (a write a kill or a full disk cut short), so a rank's older, whole dump stays its newest."""
    if not stacks.is_dir():
        return []
    return [(int(m.group(1)), p) for p in stacks.iterdir() if (m := _DUMP.match(p.name)) and _has_text(p)]


def _has_text(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:  # removed since the folder was listed
        return False
