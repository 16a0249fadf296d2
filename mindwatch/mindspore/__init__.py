"""The MindSpore adapter: the only part of mindwatch that imports MindSpore.

Example::

    from mindwatch.mindspore import MonitorCallback, TrainOneStepWithGradNorm
"""

from mindwatch.mindspore.callback import MonitorCallback
from mindwatch.mindspore.train_step import TrainOneStepWithGradNorm, TrainOneStepWithGradNormAndLossScale

#: The seed article's name for the callback (``callback.type: MindSporeTransformersMonitor``).
MindSporeTransformersMonitor = MonitorCallback

__all__ = ["MindSporeTransformersMonitor", "MonitorCallback", "TrainOneStepWithGradNorm", "TrainOneStepWithGradNormAndLossScale"]
