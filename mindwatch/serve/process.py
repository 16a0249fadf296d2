"""Run ``mindwatch serve`` as a child process beside a training (what ``mindwatch demo`` does).

Example::

    with DashboardProcess("monitor_output", port=8765) as dash:
        print(dash.url)            # http://127.0.0.1:8765/
        model.train(...)
        dash.wait()                # keep serving until Ctrl-C

A separate process, as in the architecture: the dashboard reads the run directory like any
other reader and keeps running (and showing the run) if the training crashes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from types import TracebackType


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class DashboardProcess:
    """``mindwatch serve LOGDIR --port PORT`` in a child process on 127.0.0.1."""

    def __init__(self, logdir: str | os.PathLike[str], port: int = 8765, host: str = "127.0.0.1") -> None:
        self.logdir = Path(logdir)
        self.host = host
        self.port = port if port and port_is_free(port, host) else free_port(host)  # 0 or taken: any free port
        self.proc: subprocess.Popen[bytes] | None = None
        #: The server's last stderr lines. Drained continuously: an unread pipe fills up (64 KiB) and
        #: then blocks the server's event loop on its next log line.
        self.stderr_tail: deque[str] = deque(maxlen=200)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self, timeout: float = 20.0) -> DashboardProcess:
        """Start the server and wait until it accepts connections; RuntimeError if it does not."""
        self.logdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "mindwatch.cli", "serve", str(self.logdir), "--host", self.host, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        drain = threading.Thread(target=self._drain_stderr, args=(self.proc,), name="mindwatch-dashboard-stderr", daemon=True)
        drain.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                drain.join(2)
                err = "".join(self.stderr_tail)
                raise RuntimeError(f"the dashboard exited at start (code {self.proc.returncode}): {err.strip()[-500:]}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=0.5):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the dashboard did not answer on {self.url} within {timeout:.0f} s")

    def _drain_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.stderr_tail.append(line.decode(errors="replace"))

    def wait(self) -> None:
        """Block until the server exits or Ctrl-C."""
        if self.proc is None:
            return
        if threading.current_thread() is threading.main_thread():
            # MindSpore installs its own C-level SIGINT handler, which ends the process with SIGTERM
            # and no message; put Python's back so that Ctrl-C stops the dashboard cleanly.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        with contextlib.suppress(KeyboardInterrupt):
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> DashboardProcess:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
