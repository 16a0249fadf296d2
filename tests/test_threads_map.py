"""docs/architecture.md's table of the threads stays true: every thread the package starts has its row, read from the
source (``threading.Thread(name=...)``, its f-string names, and the calls that run our code on a library's thread),
no row names a ``mindwatch-*`` thread the package no longer starts, and no thread starts without a name."""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_architecture import REPO, _section

PACKAGE = REPO / "mindwatch"

#: Calls that start a thread we name: the thread's class, and where its name goes.
NAMED_STARTS = {"threading.Thread": ("name", 2), "concurrent.futures.ThreadPoolExecutor": ("thread_name_prefix", 1)}
#: Calls that start a thread that cannot take a name.
UNNAMEABLE_STARTS = ("threading.Timer",)
#: Calls that run our code on a thread a library starts, and the words the first column of that thread's row holds.
LIBRARY_STARTS = {
    "anyio.to_thread.run_sync": "AnyIO worker threads",
    "starlette.concurrency.run_in_threadpool": "AnyIO worker threads",
    "starlette.routing.Route": "AnyIO worker threads",  # a sync endpoint: Starlette runs it in the thread pool
    "asyncio.to_thread": "asyncio's default executor",
    "run_in_executor": "asyncio's default executor",
    "prometheus_client.start_http_server": "Prometheus' HTTP thread",
    "prometheus_client.start_wsgi_server": "Prometheus' HTTP thread",
    "faulthandler.dump_traceback_later": "faulthandler's timer",
}
#: A library's thread with a part of its own, by the function that starts it: the words of its own row instead.
OWN_ROWS = {("serve/live.py", "LiveHub._loop"): "the live poll"}
#: Threads started without a name, as ``"module:function": "why it has none"``; none today: name a new one instead.
UNNAMED: dict[str, str] = {}


@dataclass(frozen=True)
class ThreadStart:
    """One place the package starts a thread (or has a library run its code on one)."""

    module: str  # relative to mindwatch/, as the table cites it: "serve/live.py"
    function: str  # where, "LiveHub._loop" (the module's top level: "")
    line: int
    call: str  # what starts it: "threading.Thread", "anyio.to_thread.run_sync", ...
    name: str | None = None  # the name given, "mindwatch-notify-<kind>" for f"mindwatch-notify-{channel.kind}"

    @property
    def where(self) -> str:
        return f"{self.module}:{self.function}"


def _dotted(node: ast.expr, aliases: Mapping[str, str]) -> str | None:
    """``anyio.to_thread.run_sync`` for the call's function, its first name resolved through the module's imports."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else node.attr
    return None


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Each name the module imports, as the dotted name it stands for (``Thread`` -> ``threading.Thread``)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update({a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0] for a in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return found


def _written_name(node: ast.expr) -> str:
    """A thread's name as the table writes it: ``f"mindwatch-notify-{channel.kind}"`` -> ``mindwatch-notify-<kind>``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_written_name(part) for part in node.values)
    if isinstance(node, ast.FormattedValue):
        held = node.value
        return f"<{held.attr if isinstance(held, ast.Attribute) else held.id if isinstance(held, ast.Name) else '?'}>"
    return "<?>"  # a name held in a variable: write it out where the thread starts, so the table can name it


def _name_given(call: ast.Call, keyword: str, position: int) -> str | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return _written_name(kw.value)
    return _written_name(call.args[position]) if len(call.args) > position else None


def _sync_endpoint(call: ast.Call, is_async: Mapping[str, bool]) -> bool:
    """A ``Route`` whose endpoint is a plain function (a lambda, or a ``def`` of that name in its folder, not ``async``)."""
    endpoint = next((kw.value for kw in call.keywords if kw.arg == "endpoint"), call.args[1] if len(call.args) > 1 else None)
    if isinstance(endpoint, ast.Lambda):
        return True
    name = endpoint.id if isinstance(endpoint, ast.Name) else endpoint.attr if isinstance(endpoint, ast.Attribute) else None
    return name is not None and not is_async.get(name, False)


@functools.cache
def _parsed(text: str) -> ast.Module:
    return ast.parse(text)  # read, never changed: the package is parsed once for every test here


def thread_starts(sources: Mapping[str, str]) -> list[ThreadStart]:
    """Every thread start in ``sources`` (``{"serve/live.py": its text}``), read from the source, never run."""
    trees = {module: _parsed(text) for module, text in sources.items()}
    is_async: dict[str, dict[str, bool]] = {}  # per folder: each function's name, and whether every def of it is async
    for module, tree in trees.items():
        folder = is_async.setdefault(str(Path(module).parent), {})
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                folder[node.name] = folder.get(node.name, True) and isinstance(node, ast.AsyncFunctionDef)
    starts: list[ThreadStart] = []
    for module, tree in trees.items():
        aliases = _aliases(tree)

        def visit(node: ast.AST, function: str, module: str = module, aliases: dict[str, str] = aliases) -> None:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                function = f"{function}.{node.name}" if function else node.name
            if isinstance(node, ast.ClassDef) and any(_dotted(b, aliases) == "threading.Thread" for b in node.bases):
                starts.append(ThreadStart(module, function, node.lineno, "threading.Thread"))  # a subclass: unnamed here
            if isinstance(node, ast.Call):
                call = _dotted(node.func, aliases) or ""
                call = "run_in_executor" if call.endswith(".run_in_executor") else call
                if call in NAMED_STARTS:
                    starts.append(ThreadStart(module, function, node.lineno, call, _name_given(node, *NAMED_STARTS[call])))
                elif call in UNNAMEABLE_STARTS or (
                    call in LIBRARY_STARTS
                    and (call != "starlette.routing.Route" or _sync_endpoint(node, is_async[str(Path(module).parent)]))
                ):
                    starts.append(ThreadStart(module, function, node.lineno, call))
            for child in ast.iter_child_nodes(node):
                visit(child, function)

        visit(tree, "")
    return starts


def table_rows(section: str) -> list[tuple[str, str]]:
    """The table's rows as (first column, the whole row), its header and rule left out."""
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    return [(row.split(" | ", 1)[0].removeprefix("| "), row) for row in rows]


def missing_from_map(starts: list[ThreadStart], rows: list[tuple[str, str]], unnamed: Mapping[str, str]) -> list[str]:
    """What the table gets wrong about ``starts``, one sentence each (none when it is true)."""
    problems = []
    for start in starts:
        at = f"{start.module}:{start.line} ({start.call})"
        if start.call in LIBRARY_STARTS:
            words = OWN_ROWS.get((start.module, start.function), LIBRARY_STARTS[start.call])
            if not any(words in first and f"`{start.module}" in row for first, row in rows):
                problems.append(f"{at} runs code on {words!r}: add its row (or cite {start.module} in it), with what it touches")
        elif start.name is None or "<?>" in start.name:
            if start.where not in unnamed:
                problems.append(f"{at} starts a thread without a name written out: give it name='mindwatch-...' and a row")
        elif not any(f"`{start.name}`" in first for first, _ in rows):
            problems.append(f"{at} starts `{start.name}`, which the table of threads lacks: add its row, saying what it touches")
    started = {s.name for s in starts if s.name}
    for first, _ in rows:
        for name in (part for part in first.split("`")[1::2] if part.startswith("mindwatch-")):
            if name not in started:
                problems.append(f"the table names `{name}`, which the package no longer starts: remove its row")
    return problems


@functools.cache
def package_sources() -> dict[str, str]:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in sorted(PACKAGE.rglob("*.py")) if "vendor" not in p.parts}


THE_TABLE = _section("The threads, and what each may touch")


def test_every_thread_the_package_starts_has_its_row_and_every_row_its_thread() -> None:
    starts = thread_starts(package_sources())
    named = {s.name for s in starts if s.name}
    assert {"mindwatch-monitor", "mindwatch-notify-<kind>", "mindwatch-lifeline", "mindwatch-dashboard-stderr"} <= named
    assert {s.where for s in starts if s.call == "anyio.to_thread.run_sync"} >= {"serve/live.py:LiveHub._loop"}
    assert any(s.call == "starlette.routing.Route" for s in starts)  # the dashboard's sync endpoints, on the thread pool
    assert missing_from_map(starts, table_rows(THE_TABLE), UNNAMED) == []


def test_a_thread_without_its_row_is_named_with_where_it_starts() -> None:
    source = (
        "import threading\n"
        "class Uploader:\n"
        "    def start(self):\n"
        "        threading.Thread(target=self._run, name=f'mindwatch-upload-{self.kind}', daemon=True).start()\n"
    )
    starts = thread_starts({**package_sources(), "sinks/upload.py": source})  # the package, and a module new to it
    assert ThreadStart("sinks/upload.py", "Uploader.start", 4, "threading.Thread", "mindwatch-upload-<kind>") in starts
    (told,) = missing_from_map(starts, table_rows(THE_TABLE), UNNAMED)
    assert told.startswith("sinks/upload.py:4 (threading.Thread) starts `mindwatch-upload-<kind>`, which the table")


def test_a_row_taken_out_of_the_table_is_missed() -> None:
    without_lifeline = THE_TABLE.replace("| `mindwatch-lifeline` |", "| `a-lifeline` |")
    without_poll = THE_TABLE.replace("| the live poll (an AnyIO worker thread) |", "| a poll |")
    starts = thread_starts(package_sources())
    server, client = missing_from_map(starts, table_rows(without_lifeline), UNNAMED)
    assert all(t.startswith("alerts/lifeline.py:") and "`mindwatch-lifeline`" in t for t in (server, client))
    (poll,) = missing_from_map(starts, table_rows(without_poll), UNNAMED)
    assert poll.startswith("serve/live.py:") and "'the live poll'" in poll


def test_a_row_whose_thread_is_gone_is_named() -> None:
    rows = [*table_rows(THE_TABLE), ("`mindwatch-uploader`", "| `mindwatch-uploader` | uploads | the network |")]
    assert missing_from_map(thread_starts(package_sources()), rows, UNNAMED) == [
        "the table names `mindwatch-uploader`, which the package no longer starts: remove its row"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "import threading\nthreading.Thread(target=print).start()\n",
        "from threading import Thread as T\nT(None, print).start()\n",
        "import threading\nNAME = 'mindwatch-x'\nthreading.Thread(target=print, name=NAME).start()\n",
        "import threading\nthreading.Timer(5.0, print).start()\n",
        "import threading\nclass Poller(threading.Thread):\n    pass\n",
        "from concurrent.futures import ThreadPoolExecutor\nThreadPoolExecutor(4)\n",
    ],
)
def test_a_thread_started_without_a_name_fails_unless_listed_with_its_reason(source: str) -> None:
    starts = thread_starts({**package_sources(), "store/poller.py": source})
    (told,) = missing_from_map(starts, table_rows(THE_TABLE), UNNAMED)
    assert told.startswith("store/poller.py:") and "without a name written out" in told
    (new,) = [s for s in starts if s.module == "store/poller.py"]
    assert missing_from_map(starts, table_rows(THE_TABLE), {new.where: "a library's own thread"}) == []


def test_a_library_thread_in_a_module_its_row_does_not_name_is_missed() -> None:
    source = "import anyio\nasync def export(path):\n    await anyio.to_thread.run_sync(print, path)\n"
    starts = thread_starts({**package_sources(), "report/export.py": source})
    (told,) = missing_from_map(starts, table_rows(THE_TABLE), UNNAMED)
    assert told.startswith("report/export.py:3 (anyio.to_thread.run_sync) runs code on 'AnyIO worker threads'")


def test_what_is_no_thread_is_not_counted() -> None:
    source = (
        "from dataclasses import dataclass\n"
        "from starlette.routing import Route\n"
        "@dataclass\nclass Thread:\n    ident: int\n"  # alerts/hang.py's stack-dump record: no threading.Thread
        "async def notes(req): ...\n"
        "ROUTES = [Route('/api/notes', notes), Thread(1)]\n"
    )
    assert thread_starts({"serve/notes.py": source}) == []
