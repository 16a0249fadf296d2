"""The monitor engine: records in, sinks fed on a worker thread, a watchdog beside it (docs/architecture.md).

- :mod:`worker`: :class:`Monitor`, the bounded queue the training thread hands records to, and the
  worker thread (``mindwatch-monitor``) that feeds every sink and writes the heartbeat;
- :mod:`watchdog`: the ``mindwatch-watchdog`` thread: stalls and stack dumps;
- :mod:`control`: what alert rules ask the training loop to do (the adapter acts on it).

Nothing here imports MindSpore, the dashboard or the report.
"""

from mindwatch.monitor.worker import Monitor, Record, Sampler
from mindwatch.store.sink import BaseSink, Sink

__all__ = ["BaseSink", "Monitor", "Record", "Sampler", "Sink"]
