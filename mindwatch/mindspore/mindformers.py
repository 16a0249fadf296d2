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
import os
import runpy
import sys

if __name__ == "__main__":  # run as a file (msrun's task script): its folder, first on sys.path, would shadow mindformers
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from mindwatch.mindspore.callback import MonitorCallback  # noqa: E402  (after the path is safe)

#: The names the callback is registered under: ours, and the one MindSpore Transformers' monitor configs use.
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
    return MonitorCallback


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
    """``python -m mindwatch.mindspore.mindformers SCRIPT [ARGS...]``: :func:`register`, then run SCRIPT as ``__main__``.

    For launchers you do not edit (MindFormers' ``run_mindformer.py``): their YAML can then name
    ``MonitorCallback`` / ``MindSporeTransformersMonitor`` in ``callbacks:``. SCRIPT sees
    ``sys.argv == [SCRIPT, *ARGS]`` and its own folder first on ``sys.path``, as with ``python SCRIPT``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: python -m mindwatch.mindspore.mindformers SCRIPT [ARGS...]   (e.g. run_mindformer.py --config x.yaml)\n"
            "       python -m mindwatch.mindspore.mindformers --path             (this file: msrun's task script)"
        )
        return 0 if args else 2
    if args == ["--path"]:
        print(os.path.abspath(__file__))
        return 0
    script = args[0]
    if not os.path.isfile(script):
        print(f"mindwatch: no such script: {script}", file=sys.stderr)
        return 2
    register()
    sys.argv = args
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


__all__ = ["CALLBACK_NAMES", "MonitorCallback", "main", "register"]

if __name__ == "__main__":
    sys.exit(main())
