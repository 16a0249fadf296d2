"""Where a live client is in a run: the lines read per rank (with the file generation) and the alerts seen.

Example::

    cursor_of(view)                   # "0:0:120,1:0:118;3": rank 0 at line 120 of generation 0, ...; 3 alerts
    parse_cursor("0:0:120;3")         # ({0: (0, 120)}, 3)

The API hands it out with every run and series answer; the live stream uses it as each event's id,
which a reconnecting EventSource sends back as ``Last-Event-ID``.
"""

from __future__ import annotations

from mindwatch.serve.views import BadRequest, RunView

RankCursor = dict[int, tuple[int, int]]


def format_cursor(ranks: RankCursor, alerts: int) -> str:
    """``{rank: (generation, lines)}`` and the alerts seen, as the cursor text."""
    return ",".join(f"{r}:{g}:{n}" for r, (g, n) in sorted(ranks.items())) + f";{alerts}"


def cursor_of(view: RunView) -> str:
    """Where ``view`` is now (call with ``view.lock`` held or after a refresh)."""
    return format_cursor({r: (c.generation, c.lines) for r, c in view.columns.items()}, len(view.alerts))


def parse_cursor(raw: str | None) -> tuple[RankCursor, int] | None:
    """``"0:0:120,1:0:118;3"`` -> ({rank: (generation, lines)}, alerts); None for no cursor; BadRequest when malformed."""
    if not raw:
        return None
    try:
        ranks_part, alerts_part = raw.split(";")
        ranks = {}
        for item in filter(None, ranks_part.split(",")):
            r, g, n = (int(v) for v in item.split(":"))
            if r < 0 or g < 0 or n < 0:
                raise ValueError
            ranks[r] = (g, n)
        alerts = int(alerts_part)
        if alerts < 0:
            raise ValueError
        return ranks, alerts
    except ValueError:
        raise BadRequest(f"cursor {raw[:60]!r} is not a cursor from this server (rank:generation:lines,...;alerts)") from None
