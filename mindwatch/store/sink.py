"""What the Monitor's worker calls on a sink: three methods every sink has, and hooks with no-op defaults.

Example::

    from mindwatch.store.sink import BaseSink

    class LossPrinter(BaseSink):
        def write(self, records):
            for rec in records:
                print(rec["step"], rec.get("loss"))

        def alert(self, alert):            # a hook: BaseSink's does nothing
            print("ALERT", alert["message"])

    Monitor([RunWriter(run_dir), LossPrinter()])

A sink that only has ``write``/``flush``/``close`` (the :class:`Sink` protocol) works too, and so
does one that defines only the hooks it needs: the Monitor calls every hook through :func:`hook`,
which gives a sink without it :class:`BaseSink`'s no-op. It lives beside the store because the
store's :class:`~mindwatch.store.writer.RunWriter` is the first sink; it imports nothing of mindwatch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Sink(Protocol):
    """Something that consumes records on the worker thread."""

    def write(self, records: list[dict[str, Any]]) -> None:
        """New records, in step order; called once per batch (at most every ``batch_secs``)."""

    def flush(self) -> None:
        """Every ``flush_secs``: make what was written durable, beat the heartbeat."""

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        """Once, when the run ends in ``state``."""


class BaseSink:
    """A sink whose every method does nothing: subclass it and override what the sink needs."""

    def write(self, records: list[dict[str, Any]]) -> None:
        """New records, in step order; called once per batch."""

    def flush(self) -> None:
        """Every ``flush_secs``."""

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        """Once, when the run ends in ``state``."""

    def alert(self, alert: dict[str, Any]) -> None:
        """Each alert a rule, the watchdog or the cross-rank watch raised (the alerts.jsonl record), on the worker thread."""

    def records_dropped(self, count: int) -> None:
        """Before each batch: how many records the full queue has turned away since the run began."""

    def plan(self, total_steps: int | None) -> None:
        """The step the training ends at, once it is known (None: unknown); from the training thread."""


#: The hooks :class:`BaseSink` declares, beside ``write``/``flush``/``close``.
HOOKS = ("alert", "records_dropped", "plan")
_DEFAULTS = BaseSink()


def hook(sink: object, name: str) -> Callable[..., None]:
    """``sink``'s hook ``name`` (one of :data:`HOOKS`): its own method, else :class:`BaseSink`'s no-op.

    Example::

        hook(sink, "alert")(alert)      # the sink's alert(), or nothing for a sink that has none
    """
    if name not in HOOKS:
        raise ValueError(f"no sink hook {name!r}; the hooks are {', '.join(HOOKS)}")
    own = getattr(sink, name, None)
    return own if callable(own) else getattr(_DEFAULTS, name)
