"""One attempt of a resumable training: ``resume_training.py SAVE_DIR INITIAL_EPOCH EPOCHS SEED [SLEEP]``.

Prints ``STEP <global step> <loss>`` per step, as an independent callback sees it.
"""

from __future__ import annotations

import sys
import time

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

from test_resume import Observer, build  # noqa: E402

from mindwatch.mindspore import MonitorCallback  # noqa: E402

save_dir, initial_epoch, epochs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pause = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
model, data = build(seed)
observer = Observer(pause=pause, echo=True)
monitor = MonitorCallback({"save_dir": save_dir, "project": "p", "run_name": "r", "resume": "allow", "flush_secs": 0.2})
model.train(epochs, data, callbacks=[observer, monitor], initial_epoch=initial_epoch, dataset_sink_mode=False)
print("DONE", time.time(), flush=True)
