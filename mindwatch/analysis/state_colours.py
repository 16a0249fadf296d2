"""What colour a run's state and an alert's severity are, wherever a person sees them: the dashboard, the report and
the terminal.

Example::

    from mindwatch.analysis.state_colours import STATE_COLOURS, state_css, terminal_style

    STATE_COLOURS["finished"].strong      # '#5470c6': the badge, the terminal's word
    state_css()                           # '.state-running { background: #1e7a4f; } ...': the badge and banner rules
    terminal_style("failed")              # 'bold #d7263d' (rich)

The report puts :func:`state_css` in its page's style; the dashboard gets the same text with the vocabulary
(``GET /api/vocabulary``'s ``state_css``) and adds it to the page. A badge is ``<span class="state state-<state>">``,
a banner ``<div class="banner banner-<state>">``; their shapes are each page's own. A severity's word is
``<span class="sev-<severity>">``, and a chart's mark of an alert takes the CSS variable ``--sev-<severity>``
(``assets/charts.js``' ``severityColour``). No other file holds a state's or a severity's colour
(``tests/test_one_owner.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mindwatch.alerts.alert import SEVERITIES


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


#: One colour per alert severity (:data:`mindwatch.alerts.alert.SEVERITIES`): its word in an alert list, its mark on a
#: chart, its word in ``mindwatch tail``. An error reads like a failed run.
SEVERITY_COLOURS: dict[str, str] = {"error": _FAILED.strong, "warning": "#e09100", "info": "#1e88e5"}
assert set(SEVERITY_COLOURS) == set(SEVERITIES), "a colour for every severity"


def state_css() -> str:
    """The colour rules of a badge (``.state``, white on :data:`NEUTRAL`), each state's badge (``.state-<state>``) and
    banner (``.banner-<state>``), each severity's variable (``--sev-<severity>``, for the charts) and word
    (``.sev-<severity>``), one per line."""
    badges = [f".state-{name} {{ background: {c.strong}; }}" for name, c in STATE_COLOURS.items()]
    banners = [f".banner-{name} {{ background: {c.soft}; color: {c.ink}; }}" for name, c in STATE_COLOURS.items()]
    variables = " ".join(f"--sev-{name}: {colour};" for name, colour in SEVERITY_COLOURS.items())
    words = [f".sev-{name} {{ color: var(--sev-{name}); }}" for name in SEVERITY_COLOURS]
    return "\n".join([f".state {{ color: #fff; background: {NEUTRAL}; }}", *badges, *banners, f":root {{ {variables} }}", *words])


def terminal_style(state: str) -> str:
    """The rich style of ``state``'s word in ``mindwatch runs`` and ``mindwatch tail``."""
    colour = STATE_COLOURS.get(state)
    return f"bold {colour.strong if colour else NEUTRAL}"


def severity_style(severity: str) -> str:
    """The rich style of an alert's ``severity`` in ``mindwatch tail``."""
    colour = SEVERITY_COLOURS.get(severity)
    return f"bold {colour}" if colour else ""
