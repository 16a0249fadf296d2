"""What colour a run's state is, wherever a person sees it: the dashboard, the report and the terminal.

Example::

    from mindwatch.analysis.state_colours import STATE_COLOURS, state_css, terminal_style

    STATE_COLOURS["finished"].strong      # '#5470c6': the badge, the terminal's word
    state_css()                           # '.state-running { background: #1e7a4f; } ...': the badge and banner rules
    terminal_style("failed")              # 'bold #d7263d' (rich)

The report puts :func:`state_css` in its page's style; the dashboard gets the same text with the vocabulary
(``GET /api/vocabulary``'s ``state_css``) and adds it to the page. A badge is ``<span class="state state-<state>">``,
a banner ``<div class="banner banner-<state>">``; their shapes are each page's own. No other file holds a state's
colour (``tests/test_one_owner.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StateColour:
    #: The badge's background (white text on it) and the terminal's word.
    strong: str
    #: The banner's background.
    soft: str
    #: The banner's text.
    ink: str


#: A state with no colour of its own (``unknown``: no status file yet): the pages' plain badge.
NEUTRAL = "#52606d"
_FAILED = StateColour("#d7263d", "#fde2e4", "#8a1c2b")
#: One colour per state of :mod:`mindwatch.store.states` (``lost`` reads like ``failed``).
STATE_COLOURS: dict[str, StateColour] = {
    "running": StateColour("#1e7a4f", "#e3f4ea", "#14532d"),
    "finished": StateColour("#5470c6", "#e0e8f9", "#1f3a8a"),
    "failed": _FAILED,
    "lost": _FAILED,
    "stalled": StateColour("#f08c00", "#fff3c4", "#7c5e10"),
    "stale": StateColour("#9a60b4", "#f3e8fd", "#5b2a86"),
    "stopped": StateColour(NEUTRAL, "#e4e7eb", "#323f4b"),
}


def state_css() -> str:
    """The colour rules of a badge (``.state``, white on :data:`NEUTRAL`), each state's badge (``.state-<state>``) and
    banner (``.banner-<state>``), one per line."""
    badges = [f".state-{name} {{ background: {c.strong}; }}" for name, c in STATE_COLOURS.items()]
    banners = [f".banner-{name} {{ background: {c.soft}; color: {c.ink}; }}" for name, c in STATE_COLOURS.items()]
    return "\n".join([f".state {{ color: #fff; background: {NEUTRAL}; }}", *badges, *banners])


def terminal_style(state: str) -> str:
    """The rich style of ``state``'s word in ``mindwatch runs`` and ``mindwatch tail``."""
    colour = STATE_COLOURS.get(state)
    return f"bold {colour.strong if colour else NEUTRAL}"
