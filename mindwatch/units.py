"""How numbers and durations read wherever a person looks (the runs table, the report, alert messages, ``tail``).

Example::

    format_number(-236670.4)     # "-236,700"   (4 significant digits, thousands separated)
    format_number(0.00312345)    # "0.003123"
    format_number(811638936.0)   # "8.116e8"
    format_number(1200)          # "1,200"      (an int is exact: a step, a count)
    format_times(8116389.4)      # "8.1 million times"
    format_change(0.35)          # "+35 %"      (a relative change: a percent, or times beyond 10x)
    format_change(8116388.4, "the median")   # "8.1 million times the median"
    format_share(0.125, "their norm")        # "12.5 % of their norm"
    format_duration(3723.4)      # "1h 02m 03s"
    format_duration(83)          # "1m 23s"
    format_duration(4.31)        # "4.3 s"
    format_duration(None)        # "-"
    format_ms(0.0042)            # "4.2 ms"
"""

from __future__ import annotations

import math
from typing import Any

#: Above this ratio a relative change reads in times ("13 times"), below as a percent ("+35 %").
TIMES_FROM = 10.0
_LARGE = ((1e9, "billion"), (1e6, "million"), (1e3, "thousand"))


def format_number(v: Any, digits: int = 4) -> str:
    """A number as a person reads it: ``digits`` significant digits, thousands separated, ``8.1e8`` beyond
    a million or below a thousandth; an int exactly (``12,345``); ``-`` for None; ``nan``, ``inf`` as such."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    a = abs(v)
    if a < 1e-3 or a >= 1e6:
        mantissa, _, power = f"{v:.{digits - 1}e}".partition("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(power)}"
    exp = math.floor(math.log10(a))
    decimals = max(0, digits - 1 - exp)
    rounded = round(v, decimals - (0 if decimals else max(0, exp - digits + 1)))
    if not decimals:
        return f"{int(round(rounded)):,}"
    text = f"{rounded:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_times(ratio: float, of: str = "") -> str:
    """How many times one value is another: ``13 times``, ``1.5 thousand times``, ``8.1 million times the median``."""
    tail = f" {of}" if of else ""
    if not math.isfinite(ratio):
        return f"{ratio} times{tail}"
    for size, word in _LARGE:
        if size <= ratio < size * 1000:
            return f"{format_number(ratio / size, 2)} {word} times{tail}"
    return f"{format_number(ratio, 2)} times{tail}"


def format_share(share: float, of: str = "") -> str:
    """A part of a whole: ``12.5 % of their norm``; from :data:`TIMES_FROM` up, ``8.1 million times their norm``."""
    if math.isfinite(share) and share < TIMES_FROM:
        return f"{format_number(100 * share, 3)} %" + (f" of {of}" if of else "")
    return format_times(share, of)


def format_change(rel: float, of: str = "") -> str:
    """A relative change (``new / old - 1``): ``+35 %``, ``-20 % on the median``; from :data:`TIMES_FROM` up,
    ``8.1 million times the median`` (the new value over the old), where a percent would be a wall of digits."""
    if math.isfinite(rel) and 1 + rel < TIMES_FROM:
        return f"{100 * rel:+.0f} %" + (f" on {of}" if of else "")
    return format_times(1 + rel, of)


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
