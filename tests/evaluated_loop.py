"""A loop of one's own that evaluates: the MindSpore tutorial's jit step on a small regression, recorded by mindwatch.

Example::

    with EvaluatedLoop(tmp_path, interval=0) as loop:
        loop.train(3)                                   # steps 1-3; loop.losses[3] is step 3's loss, as MindSpore computed it
        loop.eval(loss=0.55, accuracy=0.81, eval_time=0.4, samples=512, epoch=1)    # recorded after step 3
    run = mindwatch.open_run(loop.run_dir)

The tests of what reads an evaluation (``tail``, the console line, TensorBoard, Prometheus, ``check``) take their
reference values from here: the numbers they handed to ``run.eval`` and the losses the step returned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

FEATURES, BATCH = 8, 16


class EvaluatedLoop:
    """``start_run`` around a PyNative loop; :meth:`train` runs steps, :meth:`eval` records an evaluation after the last."""

    def __init__(self, save_dir: Path, project: str = "evals", **config: Any) -> None:
        self.config = {"save_dir": str(save_dir), "project": project, **config}
        self.losses: dict[int, float] = {}
        self.evaluations: list[dict[str, Any]] = []
        self._rng = np.random.default_rng(0)

    def __enter__(self) -> EvaluatedLoop:
        import mindspore as ms
        from mindspore import nn

        import mindwatch.mindspore as mw
        from mindwatch.demo.train import set_mode
        from mindwatch.demo.tutorial_step import jit_train_step

        set_mode("pynative")
        ms.set_seed(0)
        net = nn.SequentialCell(nn.Dense(FEATURES, 1))
        opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
        self._ms = ms
        self._step = jit_train_step(nn.WithLossCell(net, nn.MSELoss()), opt)
        self.run = mw.start_run(self.config, network=net, optimizer=opt).__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.run.__exit__(*exc)

    @property
    def run_dir(self) -> Path:
        assert self.run.run_dir is not None
        return self.run.run_dir

    @property
    def step(self) -> int:
        """The last step trained (0 before the first)."""
        return max(self.losses, default=0)

    def train(self, steps: int) -> None:
        ms = self._ms
        for _ in range(steps):
            x = self._rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
            loss, grads = self._step(ms.Tensor(x), ms.Tensor(x.sum(axis=1, keepdims=True)))
            self.run.step(loss=loss, grads=grads)
            self.losses[self.step + 1] = float(loss.asnumpy())

    def eval(self, **results: Any) -> None:
        """``run.eval(**results)`` after the last step; remembered with that step in :attr:`evaluations`."""
        self.run.eval(**results)
        self.evaluations.append({"step": self.step, **results})
