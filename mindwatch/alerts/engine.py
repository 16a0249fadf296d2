"""The rule engine: runs the alert rules over every recorded step, on the Monitor's worker thread.

Example::

    from mindwatch.alerts.engine import RuleEngine
    from mindwatch.alerts.registry import build_rules

    engine = RuleEngine(build_rules(config, rank=0), emit=monitor.alert, control=control, cooldown_secs=300)
    Monitor([writer, engine, ...])        # the engine is a sink: it sees every record batch

Each rule looks at one record at a time and returns the alerts it raises (usually none).
The engine applies the per-rule cooldown, files the requested actions on the
:class:`~mindwatch.monitor.control.Control` and emits the alert to every sink.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from mindwatch import metrics as vocab
from mindwatch.alerts.alert import Alert, Cooldown
from mindwatch.alerts.rules.base import Record, Rule
from mindwatch.monitor.control import Control

log = logging.getLogger("mindwatch")


class RuleEngine:
    """Sink that runs ``rules`` over every record, with a cooldown per (rule, metric).

    An alert that passes the cooldown gets ``suppressed`` (how many were held back since the
    last one), its actions are filed on ``control``, and it goes to ``emit`` (``Monitor.alert``).
    A rule that raises is disabled with a warning; monitoring goes on.

    ``run_wide``: false on the ranks > 0 of a multi-rank run: an alert on a value every rank shares
    (``grad_norm`` after the gradient all-reduce, ``lr``, the per-layer norms; ``metrics.py`` says which) is
    then dropped here, because rank 0 raises the same one, once for the run.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        emit: Callable[[Alert], None],
        *,
        control: Control | None = None,
        cooldown_secs: float = 300.0,
        run_wide: bool = True,
    ) -> None:
        self.run_wide = run_wide
        self.rules = list(rules)
        #: Rules a person switched off while training (``mindwatch set RUN alerts.<rule>.enabled=false``).
        self.switched_off: list[Rule] = []
        self.emit = emit
        self.control = control
        self.cooldown = Cooldown(cooldown_secs)
        self.fired = 0

    def write(self, records: list[Record]) -> None:
        for rec in records:
            for rule in list(self.rules):
                try:
                    alerts = rule.check(rec)
                except Exception as e:  # a broken rule must not stop the others
                    self.rules.remove(rule)
                    log.warning("mindwatch: alert rule %s failed (%r) and is switched off; training continues", rule.name, e)
                    continue
                for alert in alerts:
                    self.fire(alert)

    def switch(self, name: str, on: bool) -> None:
        """Switch the rules named ``name`` on or off from the next record (worker thread, like :meth:`write`)."""
        source, target = (self.switched_off, self.rules) if on else (self.rules, self.switched_off)
        moving = [r for r in source if r.name == name]
        if not moving and not any(r.name == name for r in target):
            raise ValueError(f"no rule {name} runs in this training")
        for rule in moving:
            source.remove(rule)
            target.append(rule)

    def fire(self, alert: Alert) -> bool:
        """Emit ``alert`` unless its (rule, metric) is cooling down; returns whether it went out."""
        if not self.run_wide and shared_by_every_rank(alert):
            return False
        if not self.cooldown.admit(alert):
            return False
        if self.control is not None and alert.get("actions"):
            self.control.request(alert)
        self.fired += 1
        self.emit(alert)
        return True

    def flush(self) -> None:
        pass

    def close(self, state: str, error: str | None = None, reason: str | None = None) -> None:
        pass


def shared_by_every_rank(alert: Alert) -> bool:
    """Whether the alert is about a value that is the same on every rank (so one rank speaks for the run)."""
    metric = alert.get("metric")
    known = vocab.get(metric) if isinstance(metric, str) else None
    return known is not None and known.same_on_every_rank
