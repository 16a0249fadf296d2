"""Alerts: the alert record (:mod:`alert`), the rules (:mod:`rules`, one module a rule, found by
:mod:`registry`), the engine that runs them on the worker thread (:mod:`engine`), and rank 0's
cross-rank rules (:mod:`crossrank`, with the hang diagnosis of :mod:`hang`).

Rules request actions on :class:`~mindwatch.monitor.control.Control`; the MindSpore adapter carries them out.
"""
