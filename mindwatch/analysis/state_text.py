"""What a run's state says in words: one sentence per state, for the dashboard's banner and the report's.

Example::

    from mindwatch.analysis.state_text import state_sentence
    state_sentence("failed", last_step=120, error="RuntimeError: out of memory", last_time=t, now=time.time())
    # 'Failed at step 120: RuntimeError: out of memory. Data stopped 2m 05s ago.'

The dashboard sends the sentence with the run's status (``status_summary()["banner"]``) and the
page only shows it; the report puts the run's label before it. A lost rank's sentence (:func:`lost_sentence`) is a run
summary's ``error``; ``mindwatch tail`` ends with :func:`ended_line`. No other module puts a state in words
(``tests/test_one_owner.py``).
"""

from __future__ import annotations

import re
from typing import Any

from mindwatch.store.states import FINAL_STATES, lost_ranks
from mindwatch.units import format_duration

#: Lines of an error the banner and the runs table show: the exception's line and the message's first lines.
ERROR_LINES = 3
#: A line longer than this is cut (a path, a dumped tensor): the next line still shows.
ERROR_LINE_CHARS = 240
#: A rule between a message's sections (MindSpore's "------"), a line break even inside one line.
_RULE = re.compile(r"[-=_*~#]{4,}")
_WORD = re.compile(r"[^\W_]{2,}")
#: MindSpore's last section, its C++ stack "for framework developers": where what went wrong has been said.
_STACK = "C++ Call Stack"


def _ago(t: float | None, now: float) -> str:
    return f"{format_duration(max(0.0, now - t))} ago" if t is not None else "never"


def _ended(text: str) -> str:
    """``text`` as a sentence: a full stop after it unless it ends in one (``out of memory!`` stays)."""
    return text if text.endswith((".", "!", "?", "…")) else f"{text}."


def _stopped_why(reason: str | None) -> str:
    """`` by alice: diverged`` for the reason ``stopped by alice: diverged``; ``: <reason>`` for any other."""
    if not reason:
        return ""
    return f" {reason.removeprefix('stopped ')}" if reason.startswith("stopped by ") else f": {reason}"


_TRACEBACK = "Traceback (most recent call last):"


def error_headline(error: str | None, lines: int = ERROR_LINES) -> str | None:
    """What went wrong, in the error's first ``lines`` lines that hold words, joined by spaces.

    Rules and blank lines are dropped, bullets before a heading (MindSpore's ``- Kernel error:``) too, and
    MindSpore's C++ call stack::

        error_headline("RuntimeError:\\n-----\\n- Kernel error:\\n-----\\nAdd failed: out of memory\\n...")
        # 'RuntimeError: Kernel error: Add failed: out of memory'

    A Python traceback says what went wrong at its end: the lines after its last frame are read, not its first
    ``Traceback (most recent call last):``. None for no error; the error itself when no line holds a word.
    """
    if not error:
        return None
    kept: list[str] = []
    text = error.replace("\r", "\n")
    if _TRACEBACK in text:  # what went wrong: after the last frame (``  File ...`` and its source line)
        tail = text.rsplit(_TRACEBACK, 1)[1].split("\n")
        frames = [i for i, line in enumerate(tail) if line.startswith("  File ")]
        text = "\n".join(tail[frames[-1] + 2 :] if frames else tail)
    for raw in _RULE.sub("\n", text).split("\n"):
        text = " ".join(raw.split()).lstrip("-*•> ").strip()
        if text.startswith(_STACK) or len(kept) == lines:
            break
        if _WORD.search(text):
            kept.append(text if len(text) <= ERROR_LINE_CHARS else text[: ERROR_LINE_CHARS - 1] + "…")
    return " ".join(kept) if kept else error.strip() or None


def state_sentence(
    state: str,
    *,
    last_step: int | None,
    now: float,
    error: str | None = None,
    reason: str | None = None,
    last_time: float | None = None,
    heartbeat_at: float | None = None,
) -> str:
    """The sentence for a run in ``state`` (see :mod:`mindwatch.store.states`); ``now`` is the clock ``last_time`` is read by."""
    last = _ago(last_time, now)
    why = f": {reason}" if reason else ""
    sentences = {
        "running": f"The run is still running: step {last_step}, last point {last}.",
        "finished": f"Finished: the run ended normally at step {last_step}. No more data will arrive.",
        "failed": f"Failed at step {last_step}: {_ended(error_headline(error) or 'see the training log')} Data stopped {last}.",
        "stopped": f"Stopped at step {last_step}{_stopped_why(reason)}.",
        "lost": f"The run lost a rank: {_ended(error_headline(error) or 'a rank stopped without a final state')}",
        "stalled": f"Stalled: the process is alive but no step finished for a while (last point {last}){why}.",
        "stale": (
            f"Stale: no heartbeat for {_ago(heartbeat_at, now).removesuffix(' ago') if heartbeat_at else 'a long time'}"
            f" and no final state: the process probably died (kill -9, out of memory, lost node). Last point {last}."
        ),
    }
    return sentences.get(state, f"State {state} at step {last_step}.")


def lost_sentence(statuses: dict[int, dict[str, Any]]) -> str | None:
    """Who died first and when the others ended: ``rank 1 died at step 812 (pid 4242 on host a exited); the others
    ended 1.2 s later``; None when no rank was lost (:func:`mindwatch.store.states.lost_ranks`)."""
    lost = lost_ranks(statuses)
    if not lost:
        return None
    rank, info = min(lost.items(), key=lambda item: float(item[1].get("t") or 0))
    how = {"exited": "exited", "unreachable": "stopped answering"}.get(str(info.get("how")), "sent no heartbeat")
    text = f"rank {rank} died at step {info.get('last_step')} (pid {info.get('pid')} on host {info.get('host')} {how})"
    others = [s for r, s in statuses.items() if r not in lost]
    ends = [s["updated_at"] for s in others if s.get("state") in FINAL_STATES and isinstance(s.get("updated_at"), (int, float))]
    if others and len(ends) == len(others) and isinstance(info.get("t"), (int, float)):
        text += f"; the others ended {max(0.0, max(ends) - info['t']):.1f} s later"
    return text


def ended_line(state: str, last_step: int | None) -> str:
    """What ``mindwatch tail`` says when it stops following a run: ``run ended: finished at step 120``; a ``stale`` run
    (its heartbeat stopped without a final state) says why it counts as ended."""
    why = " (no heartbeat and no final state: killed or lost)" if state == "stale" else ""
    return f"run ended: {state} at step {last_step}{why}"


def gone_sentence(rank: int, info: dict[str, Any]) -> str:
    """How a rank was seen to go, as its ``rank_lost`` alert says it: ``rank 1 is gone (pid 1234 on host a exited; last
    step 812)``; ``info`` is a lost rank's record (``pid``, ``host``, ``last_step``, ``how``: ``exited``, ``silent``,
    ``disconnected`` or ``unreachable``)."""
    pid, host = info.get("pid"), info.get("host")
    why = {
        "exited": f"pid {pid} on host {host} exited",
        "disconnected": f"pid {pid} on host {host} ended: its lifeline connection closed",
        "unreachable": f"host {host} stopped answering: pid {pid}'s lifeline went silent",
    }.get(str(info.get("how")), f"pid {pid} on host {host} sent no heartbeat")
    return f"rank {rank} is gone ({why}; last step {info.get('last_step')})"


def died_text(info: dict[str, Any]) -> str:
    """A lost rank (:func:`mindwatch.store.states.lost_ranks`) in the end-of-run message: ``died at step 40 (pid 7 on
    host a)``; what ``info`` does not know is left out."""
    where = ", ".join(f"{k} {info[k]}" for k in ("pid", "host") if info.get(k) is not None)
    at = f" at step {info['last_step']}" if info.get("last_step") is not None else ""
    return f"died{at}" + (f" ({where.replace(', host', ' on host')})" if where else "")


#: A rank that wrote no status file, for :func:`rank_end_text`.
MISSING = "missing"


def rank_end_text(state: str, status: dict[str, Any] | None) -> str:
    """How another rank ended, in the end-of-run message: ``no heartbeat after step 40 (killed or lost)``, ``failed after
    step 41: HCCL timeout``; ``state`` is its :func:`~mindwatch.store.states.rank_state` (:data:`MISSING`: no status)."""
    st = status or {}
    after = f" after step {st['last_step']}" if isinstance(st.get("last_step"), int) else ""
    why = st.get("error") or st.get("reason")
    if state == "stale":
        return f"no heartbeat{after} (killed or lost)"
    if state == MISSING:
        return "never wrote its status"
    if state == "running":
        return f"still running{after}"
    return f"{state}{after}" + (f": {why}" if why else "")


def ending_words(state: str, rank_ends: dict[int, str]) -> str:
    """How the run ended, in a message's title: ``stopped``, ``failed, rank 1 lost``, ``stopped, rank 2 failed``;
    ``rank_ends`` are the other ranks' :func:`rank_end_text` or :func:`died_text` (a rank that wrote no final state is
    lost; one that did is named by it)."""
    words = state
    gone = sorted(r for r, what in rank_ends.items() if not what.startswith(FINAL_STATES))
    if gone:
        words += f", {_ranks(gone)} lost"
    for final in FINAL_STATES:
        ended = sorted(r for r, what in rank_ends.items() if what.startswith(final))
        if ended:
            words += f", {_ranks(ended)} {final}"
    return words


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
