"""Train a tiny Llama through ``mindformers.Trainer`` on CPU with mindwatch's callback.

Run with the MindFormers environment (MindSpore 2.9 + MindFormers 1.9), from a scratch
directory (importing mindformers creates ``./output/log`` there)::

    .venv-mindformers/bin/python tests/mindformers_scripts/train_llama.py --way instance --save-dir DIR

``--way instance`` passes ``MonitorCallback(...)`` to ``Trainer(callbacks=[...])``;
``--way yaml`` writes a MindFormers YAML whose ``callbacks:`` list names ``MonitorCallback``
(after ``mindwatch.mindspore.mindformers.register()``); with ``--save-every N`` the list also has MindFormers'
``CheckpointMonitor``, saving every N steps into ``output/checkpoint/rank_0/``. The last stdout line is JSON:
``{"run_dir": ..., "log": <MindFormers' info log>}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench.mindformers_train import BATCH, SEQ, VOCAB, llama_config, yaml_config  # one tiny Llama: the bench's too


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--way", choices=["instance", "yaml"], required=True)
    p.add_argument("--save-dir", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--run-name", default=None)
    p.add_argument("--clip", action=argparse.BooleanOptionalAction, default=True, help="gradient clipping (global_norm)")
    p.add_argument("--name", default="MonitorCallback", help="the callback's registered name in the YAML")
    p.add_argument("--local-norm", action="store_true", help="YAML: the wrapper also returns local norms (a 7-item output)")
    p.add_argument("--no-register", action="store_true", help="leave registering to `python -m mindwatch.mindspore.mindformers`")
    p.add_argument("--config-as", choices=["inline", "path"], default="inline", help="monitor config in the YAML or a file")
    p.add_argument("--epochs", type=int, default=1, help="YAML: epochs of --steps steps each")
    p.add_argument("--warmup", type=int, default=2, help="YAML: the lr's linear warm-up steps from 0")
    p.add_argument("--save-every", type=int, default=0, help="YAML: CheckpointMonitor saves every N steps (0: no saves)")
    p.add_argument("--monitor", default="{}", help="JSON merged into the monitor config (rules, their actions)")
    p.add_argument("--pause", type=float, default=0.0, help="seconds each step sleeps: time for the monitor to act")
    p.add_argument("--data-parallel", action="store_true", help="YAML: data parallel over the msrun workers (use_parallel)")
    p.add_argument("--inf-at", type=int, default=0, help="the step whose loss goes NaN on --inf-rank (its embeddings inf)")
    p.add_argument("--inf-rank", type=int, default=0)
    p.add_argument("--keep-wrapper", action="store_true", help="register(wrapper=False): MindFormers' wrapper as it is")
    p.add_argument("--dump-norms", default=None, help="JSON file: numpy's norms of every parameter at every step")
    p.add_argument("--eval-every", type=int, default=0, help="YAML: do_eval every N steps on held-out tokens (0: none)")
    args = p.parse_args()
    os.environ.setdefault("GLOG_v", "3")

    import mindformers
    import mindspore as ms
    import numpy as np
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
    from mindformers.wrapper import MFTrainOneStepCell
    from mindspore import Callback
    from mindspore.dataset import GeneratorDataset
    from mindspore.nn.wrap.loss_scale import _ascend_grad_overflow

    # CPU workaround 1 (MINDSPORE_FACTS.md): the default wrapper's overflow check is Ascend-only.
    @MindFormerRegister.register(MindFormerModuleType.WRAPPER)
    class CPUTrainOneStepCell(MFTrainOneStepCell):
        def get_overflow_status(self, status, compute_output):
            return self._get_distributed_overflow_status_on_infnan_mode(_ascend_grad_overflow, compute_output)

    rng = np.random.default_rng(0)
    tokens = rng.integers(1, VOCAB, size=(args.steps * BATCH, SEQ + 1), dtype=np.int32)
    dataset = GeneratorDataset([(row,) for row in tokens], ["input_ids"], shuffle=False).batch(BATCH, drop_remainder=True)
    monitor = {"project": "mindformers", "save_dir": args.save_dir, "run_name": args.run_name, "interval": 1}
    monitor = {k: v for k, v in monitor.items() if v is not None} | json.loads(args.monitor)
    if args.local_norm:
        monitor.setdefault("layers", {"every": 1})  # MindFormers' local_norm, recorded as grad_norm/<layer> every step
    if not args.data_parallel:  # with data parallel, the context is built from the YAML below (it starts the collectives)
        mindformers.build_context({"context": {"mode": 0, "device_target": "CPU"}, "parallel": {}})

    class Pause(Callback):
        def on_train_step_end(self, run_context):
            time.sleep(args.pause)

    class InfEmbeddings(Callback):
        """Before step --inf-at, on rank --inf-rank only: the embedding table inf, so that rank's loss goes NaN (as a bad
        batch's would) and the gradients every rank shares after the all-reduce are NaN."""

        def on_train_step_begin(self, run_context):
            cb = run_context.original_args()
            rank = int(os.environ.get("RANK_ID", "0"))
            if cb.cur_step_num == args.inf_at and rank == args.inf_rank:
                table = next(p for p in cb.train_network.get_parameters() if "embedding" in p.name)
                table.set_data(ms.Tensor(np.full(table.shape, np.inf, np.float32)))

    class DumpNorms(Callback):
        """Independent of mindwatch: numpy's norms, per parameter and step, of the weights before the step, the step's
        update, the optimizer's moments after it (``adam_m.<name>``, ``adam_v.<name>``), and the gradients' squared sums
        MindFormers' own ``local_norm`` output holds (with ``--local-norm``)."""

        def __init__(self):
            self.steps = {}
            self._before = {}

        def _params(self, cb):
            return {p.name: p for p in cb.train_network.get_parameters()}

        def on_train_step_begin(self, run_context):
            cb = run_context.original_args()
            params = self._params(cb)  # the optimizer's parameters: those with moments
            self._before = {n: p.asnumpy().astype(np.float64) for n, p in params.items() if f"adam_m.{n}" in params}

        def on_train_step_end(self, run_context):
            cb = run_context.original_args()
            params = self._params(cb)
            row = {}
            for name, before in self._before.items():
                after = params[name].asnumpy().astype(np.float64)
                moments = [float(np.linalg.norm(params[f"{k}.{name}"].asnumpy())) for k in ("adam_m", "adam_v")]
                row[name] = [float(np.linalg.norm(before)), float(np.linalg.norm(after - before)), *moments]
            out = cb.net_outputs
            local = out[5].asnumpy().tolist() if len(out) == 7 else None
            self.steps[int(cb.cur_step_num)] = {"params": row, "local_norm": local, "names": list(self._before)}

        def on_train_end(self, run_context):
            Path(args.dump_norms).write_text(json.dumps(self.steps))

    extra = ([Pause()] if args.pause else []) + ([InfEmbeddings()] if args.inf_at else [])
    extra += [DumpNorms()] if args.dump_norms else []

    if args.way == "instance":
        from mindformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

        from mindwatch.mindspore import MonitorCallback

        model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in llama_config().items() if k != "type"}))
        training = TrainingArguments(
            output_dir="./output",
            batch_size=BATCH,
            num_train_epochs=1,
            sink_mode=False,
            learning_rate=1e-3,
            lr_scheduler_type="cosine",
            warmup_steps=2,
            wrapper_type="CPUTrainOneStepCell",
            use_clip_grad=args.clip,
            max_grad_norm=1.0,
            logging_steps=1,
            save_strategy="no",
            seed=0,
        )
        callback = MonitorCallback(monitor)
        trainer = Trainer(args=training, model=model, train_dataset=dataset, callbacks=[callback])
        trainer.train()
        run_dir = callback.run_dir
    else:
        import yaml
        from mindformers import Trainer

        from mindwatch.mindspore.mindformers import register

        if not args.no_register:
            register(wrapper=not args.keep_wrapper)
        config_path = Path("llama_tiny.yaml").resolve()
        entry: dict = {"type": args.name, "config": monitor}
        if args.config_as == "path":
            Path("monitor.yaml").write_text(yaml.safe_dump({"monitor_config": monitor}))
            entry["config"] = "monitor.yaml"
        config = yaml_config([entry], args.clip)
        if args.data_parallel:  # under msrun: every worker one rank of a data-parallel job
            config["use_parallel"] = True
            config["parallel"] = {"parallel_mode": 0, "gradients_mean": True, "full_batch": False}
            config["parallel_config"] = {"data_parallel": int(os.environ["MS_WORKER_NUM"]), "model_parallel": 1}
            keys = ("use_parallel", "context", "parallel", "parallel_config")
            mindformers.build_context({k: config[k] for k in keys})  # as run_mindformer.py does: init() and the context
        config["runner_wrapper"]["local_norm"] = args.local_norm
        config["runner_config"]["epochs"] = args.epochs
        config["lr_schedule"]["warmup_steps"] = args.warmup
        if args.eval_every:  # MindFormers' own evaluation in training: its EvalCallBack, which only logs the result
            config.update(do_eval=True, eval_step_interval=args.eval_every, eval_epoch_interval=-1)
            config["metric"] = {"type": "PerplexityMetric"}
        if args.save_every:
            saves = {"save_checkpoint_steps": args.save_every, "keep_checkpoint_max": 100}
            config["callbacks"].append({"type": "CheckpointMonitor", "prefix": "llama_tiny", **saves})
        # msrun's workers (and, without init(), its scheduler) share this folder: write whole, never read half a file
        partial = config_path.with_name(f".{config_path.name}.{os.getpid()}")
        partial.write_text(yaml.safe_dump(config, sort_keys=False))
        os.replace(partial, config_path)
        held_out = [(row,) for row in rng.integers(1, VOCAB, size=(2 * BATCH, SEQ), dtype=np.int32)]
        eval_dataset = GeneratorDataset(held_out, ["input_ids"], shuffle=False).batch(BATCH, drop_remainder=True)
        trainer = Trainer(
            args=str(config_path),
            train_dataset=dataset,
            eval_dataset=eval_dataset if args.eval_every else None,
            callbacks=extra or None,
        )
        trainer.train()
        run_dir = _only_run(Path(args.save_dir) / "mindformers")

    log = Path("output/log/rank_0/info.log").resolve()
    print(json.dumps({"run_dir": str(run_dir), "log": str(log)}), flush=True)
    return 0


def _only_run(project_dir: Path) -> Path:
    runs = [p for p in project_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]  # not .rendezvous
    if len(runs) != 1:
        raise SystemExit(f"expected one run in {project_dir}, found {runs}")
    return runs[0]


if __name__ == "__main__":
    sys.exit(main())
