"""The MindSpore adapter: the only part of mindwatch that imports MindSpore.

Example::

    from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm   # Model.train
    import mindwatch.mindspore as mw; run = mw.start_run("monitor.yaml", network=net, optimizer=opt)   # a loop of your own
    batch = mw.DynamicBatch(32, min=8); ds = ds.batch(batch); MonitorCallback(cfg, batch=batch)  # a batch size that changes
"""

from mindwatch.mindspore.callback import MonitorCallback
from mindwatch.mindspore.dynamic_batch import DynamicBatch
from mindwatch.mindspore.grad_reducer import DistributedGradReducer
from mindwatch.mindspore.loop import Run, start_run
from mindwatch.mindspore.reduction import grad_norm
from mindwatch.mindspore.router_stats import RouterStats
from mindwatch.mindspore.skip_step import SkipStep
from mindwatch.mindspore.train_step import TrainOneStepWithGradNorm, TrainOneStepWithGradNormAndLossScale

#: The name MindSpore Transformers' monitor configs give the callback (``callback.type: MindSporeTransformersMonitor``).
MindSporeTransformersMonitor = MonitorCallback

__all__ = [
    "DistributedGradReducer",
    "DynamicBatch",
    "MindSporeTransformersMonitor",
    "MonitorCallback",
    "RouterStats",
    "Run",
    "SkipStep",
    "TrainOneStepWithGradNorm",
    "TrainOneStepWithGradNormAndLossScale",
    "grad_norm",
    "start_run",
]
