"""No step end for longer than the stall timeout: the watchdog thread raises it (:mod:`mindwatch.monitor.watchdog`).

Example::

    alerts: {stall_timeout: 600, stall: {actions: [dump_stacks]}}

Its timing keys (``stall_timeout``, ``stall_floor``, ``stall_factor``, ``first_step_timeout``) sit
directly under ``alerts``; the watchdog is built by the session, not by the rule engine.
"""

from __future__ import annotations

from mindwatch.alerts.rules.base import RuleSpec
from mindwatch.schema import RuleSettings

SPEC = RuleSpec(
    "stall",
    RuleSettings,
    None,
    doc="no step ended within the stall timeout (before the first step: `first_step_timeout`); dumps every thread's stack",
)
