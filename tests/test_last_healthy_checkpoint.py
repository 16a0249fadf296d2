"""The ``checkpoint`` action's ``last_healthy_checkpoint``: found among the files of a ``ModelCheckpoint`` subclass too.

MindFormers' ``CheckpointMonitor`` subclasses ``ModelCheckpoint`` and writes
``output/checkpoint/rank_<R>/<prefix>_rank_<R>-<epoch>_<step in epoch>.ckpt``; tests/test_mindformers.py trains with
it. Here a subclass of our own writes the same names, with ``ms.save_checkpoint``, in the main environment.
"""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import pytest
from mindspore import nn
from mindspore.train import Callback, ModelCheckpoint

from mindwatch.mindspore.actions import checkpoint_files, last_healthy_checkpoint


class RankCheckpoint(ModelCheckpoint):
    """Saves as ``CheckpointMonitor`` does: ``<directory>/checkpoint/rank_0/<prefix>_rank_0-<epoch>_<step>.ckpt``."""

    def __init__(self, prefix: str, directory: Path) -> None:
        super().__init__(f"{prefix}_rank_0", str(directory / "checkpoint" / "rank_0"))


class Elsewhere(Callback):
    """Not a checkpoint callback, though it has a ``_directory`` of checkpoints."""

    def __init__(self, directory: Path) -> None:
        self._directory = str(directory)


def _save(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint(nn.Dense(2, 2), str(directory / name))
    return directory / name


@pytest.mark.parametrize(
    ("per_epoch", "saved", "anomaly", "healthy"),
    [
        # 4 steps an epoch, saved every 2: global steps 2, 4, 6, 8; the anomaly at 6 leaves step 4 (epoch 1, step 4)
        (4, {2: "1_2", 4: "1_4", 6: "2_2", 8: "2_4"}, 6, 4),
        (4, {2: "1_2", 4: "1_4", 6: "2_2", 8: "2_4"}, 7, 6),
        # sink mode, sink size 2: an epoch is one sink, batch_num 2, every name ends in _2
        (2, {2: "1_2", 4: "2_2", 6: "3_2"}, 6, 4),
    ],
)
def test_the_newest_file_before_the_anomaly_of_a_model_checkpoint_subclass(
    tmp_path: Path, per_epoch: int, saved: dict[int, str], anomaly: int, healthy: int
) -> None:
    saver = RankCheckpoint("llama_tiny", tmp_path / "output")
    directory = Path(saver._directory)
    paths = {step: _save(directory, f"llama_tiny_rank_0-{name}.ckpt") for step, name in saved.items()}
    other = _save(tmp_path / "elsewhere", "other-1_1.ckpt")

    files = checkpoint_files([Elsewhere(other.parent), saver], latest=None)
    assert sorted(files) == sorted(paths.values())  # only the ModelCheckpoint's folder
    found = last_healthy_checkpoint(files, before_step=anomaly, steps_per_epoch=per_epoch, before_t=0.0)
    assert found == paths[healthy]
    assert ms.load_checkpoint(str(found))  # a real checkpoint


def test_safetensors_count_and_none_before_the_first_save(tmp_path: Path) -> None:
    saver = RankCheckpoint("llama_tiny", tmp_path)
    directory = Path(saver._directory)
    first = directory / "llama_tiny_rank_0-1_3.safetensors"
    ms.save_checkpoint(nn.Dense(2, 2), str(first), format="safetensors")

    files = checkpoint_files([saver], latest=None)
    assert files == [first]
    assert last_healthy_checkpoint(files, before_step=4, steps_per_epoch=10, before_t=0.0) == first
    assert last_healthy_checkpoint(files, before_step=3, steps_per_epoch=10, before_t=0.0) is None
