"""mindwatch: a live monitor for MindSpore training.

Example::

    from mindwatch.mindspore import MonitorCallback
    model.train(epochs, ds, callbacks=[MonitorCallback("monitor.yaml")])

    import mindwatch
    run = mindwatch.open_run("monitor_output/default/run_20261129_074500")
    run.series("loss").value

Only ``mindwatch.mindspore`` and ``mindwatch.demo`` import MindSpore (docs/architecture.md).
"""

__version__ = "0.1.0"

from mindwatch.config import ConfigError, MonitorConfig, load_config  # noqa: E402
from mindwatch.store.reader import Run, Series, open_run  # noqa: E402

__all__ = ["ConfigError", "MonitorConfig", "Run", "Series", "__version__", "load_config", "open_run"]
