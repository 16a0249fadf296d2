"""Framework-free engine: the Monitor (queue + worker) and what runs on its worker."""

from mindwatch.core.monitor import Monitor, Record, Sampler, Sink

__all__ = ["Monitor", "Record", "Sampler", "Sink"]
