"""What both front doors share: the config they take, how a run starts and ends, a user's own metrics, sample ids.

Example::

    config = merged_config("monitor.yaml", {"interval": 10})        # every form the config takes, keywords on top
    recorder = start_recorder(config, Training(opt, saved=net))     # None (a warning said why): train without us
    log_metrics(recorder, step, {"accuracy": 0.9})                  # a user's own metrics at a step
    recorder.finish("stopped", reason=stop_reason(recorder, "stopped", "stopped by the training loop"))

``MonitorCallback`` (``callback.py``, for ``Model.train``) and ``Run`` (``loop.py``, a loop of your own) each
read the step their own way; the policy here is the one both follow, so that the same config does the same in
either. Neither door imports the other. Training thread only.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import Any

import mindspore as ms
import numpy as np

from mindwatch.config import MonitorConfig, load_config
from mindwatch.mindspore.ranks import NotATrainingRank, RankError
from mindwatch.mindspore.recorder import StepRecorder, Training
from mindwatch.session import ResumeError, SaveDirUnavailable

log = logging.getLogger("mindwatch")
_wall = time.time

#: What a front door takes as its config: a ``MonitorConfig``, a dict, a YAML string or a path to a YAML file.
ConfigLike = MonitorConfig | dict[str, Any] | str | os.PathLike[str] | None

_COULD_NOT_START = "mindwatch: could not start monitoring (%r); this training goes on without mindwatch"


def merged_config(config: ConfigLike, overrides: dict[str, Any]) -> MonitorConfig:
    """``config`` in any form :func:`~mindwatch.config.load_config` takes, with keyword ``overrides`` on top."""
    cfg = load_config(config)
    if overrides:
        cfg = load_config({**cfg.model_dump(exclude_unset=True), **overrides})
    return cfg


def start_recorder(config: MonitorConfig, training: Training) -> StepRecorder | None:
    """The recorder of ``training``, which begins; None (with a warning) when monitoring cannot start, unless
    ``strict``.

    The monitor never takes the training down at start: only ``strict: true`` and ``resume: must`` (a request to
    stop here when the run is missing) raise.
    """
    try:
        return StepRecorder.start(config, training)
    except NotATrainingRank as e:  # its init() returns at the job's end: it trains only where init() was never called
        log.warning("mindwatch: %s, not a rank of the training: it records nothing (call init() first)", e)
    except SaveDirUnavailable as e:
        if config.strict:
            raise
        log.warning("%s; this training goes on without mindwatch", e)
    except Exception as e:
        if config.strict or isinstance(e, ResumeError):
            raise
        could_not_start(e)
    return None


def could_not_start(error: Exception, recorder: StepRecorder | None = None) -> None:
    """Monitoring cannot start (``error``): say why, end ``recorder``'s run ``stopped`` if it began; the training
    goes on without mindwatch."""
    if isinstance(error, RankError):
        log.error("mindwatch: %s; this training goes on without mindwatch", error)
    else:
        log.warning(_COULD_NOT_START, error, exc_info=error)
    if recorder is not None:
        recorder.finish("stopped", reason=f"mindwatch could not start: {error!r}")


def log_metrics(recorder: StepRecorder | None, step: int, metrics: dict[str, Any]) -> None:
    """Record a user's own ``metrics`` (numbers, names of their own) at ``step``, without counting a step."""
    if recorder is not None:
        recorder.session.monitor.record({"step": int(step), "t": _wall(), "rank": recorder.rank, **metrics})


def failure_text(exc_type: Any, exc: BaseException) -> str:
    """The error a run that failed records: the exception's last line(s), as Python prints them."""
    return "".join(traceback.format_exception_only(exc_type, exc)).strip()


def stop_reason(recorder: StepRecorder, state: str, otherwise: str) -> str | None:
    """Why a run ends ``state``: when ``stopped``, the alert behind the ``stop`` action, else ``otherwise`` (who
    else stopped it); None for any other state."""
    if state != "stopped":
        return None
    return recorder.actions.stop_reason or otherwise


def listed_ids(ids: Any) -> list[Any]:
    """A batch's sample ids as a plain list (a Tensor's or an array's values, flattened)."""
    if isinstance(ids, ms.Tensor):
        ids = ids.asnumpy()
    return np.asarray(ids).reshape(-1).tolist()
