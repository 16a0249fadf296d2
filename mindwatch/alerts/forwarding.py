"""Rank 0 alone sends notifications: the other ranks' alerts, as ``alerts.jsonl`` holds them, go out from there.

Example::

    forwarder = AlertForwarder(notify.alert)
    forwarder.saw(alert)      # each alert rank 0's cross-rank watch reads from alerts.jsonl (its worker thread)

Rank 0's own alerts reach its notify channels as every sink gets them; the alerts rank 0 raised for the run
(``reported_by: 0``) likewise. Interventions are not forwarded: every rank carries an action out at one step,
and rank 0 tells of its own, one message for the run.
"""

from __future__ import annotations

from collections.abc import Callable

from mindwatch.alerts.alert import Alert


class AlertForwarder:
    """Hands the other ranks' alerts to ``forward`` (rank 0's notify channels). See the module docstring."""

    def __init__(self, forward: Callable[[Alert], None]) -> None:
        self.forward = forward

    def saw(self, rank: int, alert: Alert) -> None:
        """``rank``'s alert, read from ``alerts.jsonl``: forwarded unless rank 0 told of it already."""
        if alert.get("reported_by", rank) != 0 and alert.get("rule") != "intervention":
            self.forward(alert)
