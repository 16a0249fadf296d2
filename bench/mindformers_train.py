"""One training of ``python -m bench mindformers``: a tiny Llama through MindFormers' ``Trainer`` (a YAML whose
``callbacks:`` list MindFormers' ``MFLossMonitor`` and, with ``--monitor``, mindwatch's ``MonitorCallback``), on CPU.

Run in the MindFormers environment, from a scratch directory (MindFormers writes ``./output/log`` there), with the
checkout on ``PYTHONPATH``::

    .venv-mindformers/bin/python -m bench.mindformers_train --steps 300                        # without mindwatch
    .venv-mindformers/bin/python -m bench.mindformers_train --steps 300 --monitor '{"save_dir": "mw"}'

The model and the YAML are those of ``tests/mindformers_scripts/train_llama.py`` (2 layers, hidden 64, batch 2 x 32
tokens, AdamW, a cosine lr schedule, gradient clipping). A last callback of the bench's own counts the CPU of every
thread (:mod:`bench.threadcpu`) from the end of step 2 to the end of the last step, the span the bench times from
MindFormers' step log, and the CPU and wall time of ``MonitorCallback``'s step hooks over the same steps (each hook
timed from inside: about 0.3 us a call of clock reads). The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench import threadcpu

VOCAB, SEQ, BATCH, HIDDEN, LAYERS, HEADS = 256, 32, 2, 64, 2, 4


def llama_config() -> dict[str, Any]:
    """The tiny Llama, with the CPU workarounds: no rope slicing op, no flash attention, no fused RMSNorm; float32."""
    return {
        "type": "LlamaConfig",
        "batch_size": BATCH,
        "seq_length": SEQ,
        "hidden_size": HIDDEN,
        "num_layers": LAYERS,
        "num_heads": HEADS,
        "vocab_size": VOCAB,
        "compute_dtype": "float32",
        "param_init_type": "float32",
        "layernorm_compute_type": "float32",
        "softmax_compute_type": "float32",
        "rotary_dtype": "float32",
        "use_rope_slice": True,
        "use_flash_attention": False,
        "fused_rms_norm": False,
    }


def yaml_config(callbacks: list[dict[str, Any]], clip: bool = True) -> dict[str, Any]:
    """MindFormers' YAML for the training (``tests/mindformers_scripts/train_llama.py``'s too), ``callbacks`` after
    MindFormers' ``MFLossMonitor``; ``clip``: gradient clipping (its ``global_norm``)."""
    return {
        "seed": 0,
        "output_dir": "./output",
        "run_mode": "train",
        "use_parallel": False,
        "trainer": {"type": "CausalLanguageModelingTrainer", "model_name": "llama_tiny"},
        "runner_config": {"epochs": 1, "batch_size": BATCH, "sink_mode": False, "sink_size": 1},
        "runner_wrapper": {"type": "CPUTrainOneStepCell", "use_clip_grad": clip, "max_grad_norm": 1.0, "scale_sense": 1.0},
        "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
        "lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": 1e-3, "warmup_steps": 2, "total_steps": -1},
        "context": {"mode": 0, "device_target": "CPU"},
        "parallel": {},
        "model": {"model_config": llama_config(), "arch": {"type": "LlamaForCausalLM"}},
        "callbacks": [{"type": "MFLossMonitor"}, *callbacks],
    }


class HookClock:
    """CPU (``thread_time_ns``) and wall (``perf_counter_ns``) nanoseconds inside a callback's step hooks, from when
    :meth:`count` is called on (the steps before it are not counted)."""

    def __init__(self) -> None:
        self.cpu_ns = self.wall_ns = 0
        self.counting = False

    def wrap(self, callback: Any) -> None:
        for name in ("on_train_step_begin", "on_train_step_end"):
            setattr(callback, name, self._timed(getattr(callback, name)))

    def _timed(self, hook: Any) -> Any:
        def timed(run_context: Any) -> None:
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            hook(run_context)
            if self.counting:
                self.cpu_ns += time.thread_time_ns() - cpu
                self.wall_ns += time.perf_counter_ns() - wall

        return timed


def probe(steps: int, clock: HookClock, out: dict[str, Any]) -> Any:
    """The last callback: wraps ``MonitorCallback``'s step hooks (train begin), and snapshots every thread's CPU at
    the end of step 2 and of step ``steps`` (before ``on_train_end``: mindwatch's threads are still alive)."""
    from mindspore import Callback

    from mindwatch.mindspore import MonitorCallback

    class Probe(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.before: threadcpu.Snapshot = {}

        def on_train_begin(self, run_context: Any) -> None:
            for cb in run_context.original_args().list_callback or ():
                if isinstance(cb, MonitorCallback):
                    clock.wrap(cb)

        def on_train_step_end(self, run_context: Any) -> None:
            step = run_context.original_args().cur_step_num
            if step == 2:
                clock.counting = True
                self.before = threadcpu.snapshot()
            elif step == steps:
                after = threadcpu.snapshot()
                clock.counting = False
                main = threading.main_thread().native_id
                threads: dict[str, float] = {}
                for tid, (name, cpu) in threadcpu.by_thread(self.before, after).items():
                    key = "training" if tid == main else name
                    threads[key] = threads.get(key, 0.0) + cpu
                out["threads"] = threads
                out["hook_cpu"], out["hook_wall"] = clock.cpu_ns / 1e9, clock.wall_ns / 1e9

    return Probe()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mindformers_train", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--monitor", default=None, help="mindwatch's config as JSON (its callback in the YAML); none: without")
    args = p.parse_args(argv)
    if args.steps < 4:
        p.error("--steps must be at least 4 (the figures run from the end of step 2)")
    os.environ.setdefault("GLOG_v", "3")

    import mindformers
    import numpy as np
    import yaml
    from mindformers import Trainer
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
    from mindformers.wrapper import MFTrainOneStepCell
    from mindspore.dataset import GeneratorDataset
    from mindspore.nn.wrap.loss_scale import _ascend_grad_overflow

    from mindwatch.mindspore.mindformers import register

    @MindFormerRegister.register(MindFormerModuleType.WRAPPER)
    class CPUTrainOneStepCell(MFTrainOneStepCell):  # the default wrapper's overflow check is Ascend-only
        def get_overflow_status(self, status, compute_output):
            return self._get_distributed_overflow_status_on_infnan_mode(_ascend_grad_overflow, compute_output)

    monitor = json.loads(args.monitor) if args.monitor is not None else None
    register(wrapper=monitor is not None)  # without mindwatch: MindFormers' own wrapper, as MindFormers builds it
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, VOCAB, size=(args.steps * BATCH, SEQ + 1), dtype=np.int32)
    dataset = GeneratorDataset([(row,) for row in tokens], ["input_ids"], shuffle=False).batch(BATCH, drop_remainder=True)
    mindformers.build_context({"context": {"mode": 0, "device_target": "CPU"}, "parallel": {}})
    config_path = Path("llama_tiny.yaml").resolve()
    callbacks = [{"type": "MonitorCallback", "config": monitor}] if monitor is not None else []
    config_path.write_text(yaml.safe_dump(yaml_config(callbacks), sort_keys=False))
    out: dict[str, Any] = {"steps": args.steps, "mindwatch": monitor is not None}
    clock = HookClock()
    Trainer(args=str(config_path), train_dataset=dataset, callbacks=[probe(args.steps, clock, out)]).train()
    out["log"] = str(Path("output/log/rank_0/info.log").resolve())
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
