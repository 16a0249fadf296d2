"""mindwatch in MindSpore Transformers (MindFormers): the callback by name in a MindFormers YAML.

Example::

    from mindwatch.mindspore.mindformers import register
    register()       # before building the Trainer: makes the names below known to MindFormers

    # in the MindFormers YAML, next to MindFormers' own callbacks:
    # callbacks:
    #   - type: MFLossMonitor
    #   - type: MonitorCallback              # or the article's name: MindSporeTransformersMonitor
    #     config: monitor.yaml               # a monitor_config path, or the section inline:
    #     # config: {project: llama-pretrain, save_dir: ./monitor_output, tensorboard: true}

Passing an instance works without registering:
``Trainer(args, model=..., train_dataset=..., callbacks=[MonitorCallback({...})])``.
The callback reads MindFormers' train-cell outputs ``(loss, overflow, loss_scale, lr, global_norm)``
(see :mod:`mindwatch.mindspore.outputs`), so no train cell of ours is needed there.
"""

from __future__ import annotations

from mindwatch.mindspore.callback import MonitorCallback

#: The names the callback is registered under: ours and the seed article's.
CALLBACK_NAMES = ("MonitorCallback", "MindSporeTransformersMonitor")


def register() -> type[MonitorCallback]:
    """Register :class:`MonitorCallback` in MindFormers' callback registry under :data:`CALLBACK_NAMES`.

    Example::

        from mindwatch.mindspore.mindformers import register
        register()
        trainer = Trainer("llama_tiny.yaml", train_dataset=ds)   # YAML lists `type: MonitorCallback`

    Idempotent. Raises ImportError with what to install when MindFormers is missing.
    """
    try:
        from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
    except ImportError as e:
        raise ImportError(
            "mindwatch.mindspore.mindformers.register() needs MindSpore Transformers: "
            'pip install "mindformers==1.9.0" "mindspore==2.9.0" "numpy<2" (checked combination)'
        ) from e
    for name in CALLBACK_NAMES:
        MindFormerRegister.register_cls(MonitorCallback, MindFormerModuleType.CALLBACK, alias=name)
    return MonitorCallback


__all__ = ["CALLBACK_NAMES", "MonitorCallback", "register"]
