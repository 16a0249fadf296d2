"""Sinks: where records go from the worker thread (console, TensorBoard, Prometheus, notify)."""

from mindwatch.sinks.console import ConsoleSummary, format_summary

__all__ = ["ConsoleSummary", "format_summary"]
