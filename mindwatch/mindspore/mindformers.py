"""mindwatch in MindSpore Transformers (MindFormers): the callback by name in a MindFormers YAML.

Example::

    from mindwatch.mindspore.mindformers import register
    register()       # before building the Trainer: makes the names below known to MindFormers

    # in the MindFormers YAML, next to MindFormers' own callbacks:
    # callbacks:
    #   - type: MFLossMonitor
    #   - type: MonitorCallback              # or MindSporeTransformersMonitor, as monitor configs name it
    #     config: monitor.yaml               # a monitor_config path, or the section inline:
    #     # config: {project: llama-pretrain, save_dir: ./monitor_output, tensorboard: true}

With MindFormers' own launcher, which you do not edit, let mindwatch register first and then run it::

    python -m mindwatch.mindspore.mindformers run_mindformer.py --config llama_7b.yaml --run_mode train

Under ``msrun``, which runs a file, this module's file is the task script (``--path`` prints it)::

    msrun --worker_num=8 --local_worker_num=8 --master_port=8118 --log_dir=msrun_log --join=True \
        "$(python -m mindwatch.mindspore.mindformers --path)" run_mindformer.py --config llama_7b.yaml

Passing an instance works without registering:
``Trainer(args, model=..., train_dataset=..., callbacks=[MonitorCallback({...})])``.
The callback reads MindFormers' train-cell outputs ``(loss, overflow, loss_scale, lr, global_norm)``
(see :mod:`mindwatch.mindspore.outputs`), so no train cell of ours is needed there.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import runpy
import sys
from typing import Any

if __name__ == "__main__":  # run as a file (msrun's task script): its folder, first on sys.path, would shadow mindformers
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from mindwatch.mindspore.callback import MonitorCallback  # noqa: E402  (after the path is safe)
from mindwatch.mindspore.mindformers_eval import watch_evaluations  # noqa: E402  (after the path is safe)

log = logging.getLogger("mindwatch")

#: The names the callback is registered under: ours, and the one MindSpore Transformers' monitor configs use.
CALLBACK_NAMES = ("MonitorCallback", "MindSporeTransformersMonitor")


#: Whether a YAML's ``MFTrainOneStepCell`` (or subclass) is built as mindwatch's wrapper (``register(wrapper=...)``).
_wrapping = {"on": False}


def register(wrapper: bool = True) -> type[MonitorCallback]:
    """Register :class:`MonitorCallback` in MindFormers' callback registry under :data:`CALLBACK_NAMES`, and with
    ``wrapper`` build a YAML's ``runner_wrapper`` as mindwatch's train wrapper.

    Example::

        from mindwatch.mindspore.mindformers import register
        register()
        trainer = Trainer("llama_tiny.yaml", train_dataset=ds)   # YAML lists `type: MonitorCallback`

    ``wrapper``: where the ``runner_wrapper`` is ``MFTrainOneStepCell`` or a subclass of it (a user's own too, registered
    before or after this call), MindFormers builds :func:`~mindwatch.mindspore.mindformers_wrapper.watched_wrapper` of
    it: the same step and outputs, with the cross-rank signal (actions on the very step), every per-layer statistic,
    ``skip_steps`` and a rewind's pass-over. ``register(wrapper=False)`` keeps MindFormers' wrapper as it is (actions
    agree through files then, docs/mindformers.md). Idempotent; the last call's ``wrapper`` holds. Raises ImportError
    with what to install when MindFormers is missing.
    """
    try:
        from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
    except ImportError as e:
        shadow = _shadowing_file()
        if shadow is not None:
            raise ImportError(
                f"mindwatch.mindspore.mindformers.register(): 'import mindformers' found the file {shadow}, not MindSpore "
                "Transformers: a file named mindformers.py in a folder on sys.path (the running script's folder comes "
                "first) hides the package; rename that file or run from another folder"
            ) from e
        raise ImportError(
            "mindwatch.mindspore.mindformers.register() needs MindSpore Transformers: "
            'pip install "mindformers==1.9.0" "mindspore==2.9.0" "numpy<2" (checked combination)'
        ) from e
    for name in CALLBACK_NAMES:
        MindFormerRegister.register_cls(MonitorCallback, MindFormerModuleType.CALLBACK, alias=name)
    _wrapping["on"] = wrapper
    _build_wrappers_watched(MindFormerRegister, MindFormerModuleType.WRAPPER)
    import mindformers.trainer.base_trainer  # noqa: F401  # its do_eval, recorded (mindformers_eval)

    watch_evaluations()
    return MonitorCallback


def _build_wrappers_watched(registry: Any, wrapper_type: Any) -> None:
    """MindFormers builds its train wrapper with ``MindFormerRegister.get_instance_from_cfg``: in front of it, a
    ``type`` naming ``MFTrainOneStepCell`` or a subclass becomes mindwatch's wrapper of that class (once patched)."""
    if getattr(registry.get_instance_from_cfg, "mindwatch", False):
        return
    from mindformers.wrapper import MFTrainOneStepCell

    from mindwatch.mindspore.mindformers_wrapper import watched_wrapper

    build = registry.get_instance_from_cfg.__func__

    def get_instance_from_cfg(cls: Any, cfg: Any, module_type: Any = wrapper_type, default_args: Any = None) -> Any:
        kind = cfg.get("type") if isinstance(cfg, dict) else None
        if _wrapping["on"] and module_type == wrapper_type and isinstance(kind, str) and cls.is_exist(module_type, kind):
            found = cls.get_cls(module_type, kind)
            if isinstance(found, type) and issubclass(found, MFTrainOneStepCell):
                cfg = cfg.copy()
                cfg["type"] = watched_wrapper(found)
                log.info("mindwatch: MindFormers' %s is built as mindwatch's wrapper of it", kind)
        return build(cls, cfg, module_type, default_args)

    get_instance_from_cfg.mindwatch = True  # type: ignore[attr-defined]
    registry.get_instance_from_cfg = classmethod(get_instance_from_cfg)


def _shadowing_file() -> str | None:
    """The module file that ``import mindformers`` finds instead of the package, if one does."""
    try:
        spec = importlib.util.find_spec("mindformers")
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec
        module = sys.modules.get("mindformers")
        return getattr(module, "__file__", None) if module is not None and not hasattr(module, "__path__") else None
    if spec is None or spec.submodule_search_locations is not None:
        return None
    return spec.origin


def main(argv: list[str] | None = None) -> int:
    """``python -m mindwatch.mindspore.mindformers [--keep-wrapper] SCRIPT [ARGS...]``: :func:`register` (with
    ``wrapper=False`` after ``--keep-wrapper``), then run SCRIPT as ``__main__``.

    For launchers you do not edit (MindFormers' ``run_mindformer.py``): their YAML can then name
    ``MonitorCallback`` / ``MindSporeTransformersMonitor`` in ``callbacks:``. SCRIPT sees
    ``sys.argv == [SCRIPT, *ARGS]`` and its own folder first on ``sys.path``, as with ``python SCRIPT``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    keep = bool(args) and args[0] == "--keep-wrapper"
    args = args[1:] if keep else args
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: python -m mindwatch.mindspore.mindformers [--keep-wrapper] SCRIPT [ARGS...]   (e.g. run_mindformer.py "
            "--config x.yaml)\n"
            "       python -m mindwatch.mindspore.mindformers --path             (this file: msrun's task script)\n"
            "--keep-wrapper: MindFormers' own train wrapper, not mindwatch's (actions then agree through files)"
        )
        return 0 if args else 2
    if args == ["--path"]:
        print(os.path.abspath(__file__))
        return 0
    script = args[0]
    if not os.path.isfile(script):
        print(f"mindwatch: no such script: {script}", file=sys.stderr)
        return 2
    register(wrapper=not keep)
    sys.argv = args
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


__all__ = ["CALLBACK_NAMES", "MonitorCallback", "main", "register"]

if __name__ == "__main__":
    sys.exit(main())
