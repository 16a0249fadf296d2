"""How durations read wherever a person looks (the runs table, the report, alert messages).

Example::

    format_duration(3723.4)      # "1h 02m 03s"
    format_duration(83)          # "1m 23s"
    format_duration(4.31)        # "4.3 s"
    format_duration(None)        # "-"
    format_ms(0.0042)            # "4.2 ms"
"""

from __future__ import annotations


def format_duration(secs: float | None) -> str:
    """A duration in hours, minutes and seconds, as short as it can be; ``-`` when unknown."""
    if secs is None:
        return "-"
    h, rem = divmod(int(round(secs)), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else (f"{m}m {s:02d}s" if m else f"{secs:.1f} s")


def format_ms(secs: float) -> str:
    """A short time in milliseconds: ``120 ms``, ``4.2 ms``."""
    ms = secs * 1000
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.2g} ms"
