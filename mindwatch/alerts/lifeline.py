"""A lifeline between rank 0 and every other rank: one TCP connection each, so a rank that dies is known at once,
on any host, with or without a shared file system.

Example::

    server = LifelineServer("10.0.0.1", me={"pid": os.getpid(), "host": "node0"}, on_gone=lambda rank, who: ...)
    server.address                      # "10.0.0.1:41873": rank 0 announces it in the train step's signal

    client = LifelineClient(server.address, me={"rank": 1, "pid": os.getpid(), "host": "node1"},
                            on_gone=lambda who: ...)   # rank 0's process ended without saying goodbye
    client.close()                      # a clean end says "bye": the other side raises nothing

When a process ends, its kernel closes its sockets, so the other side reads the end of the stream within
milliseconds, whatever killed it (``kill -9``, the OOM killer, a crash); a host that vanishes is not seen this way
(no packet comes back), which is what the heartbeats of a shared run directory are for. A side that says ``bye``
first (its session closed: finished, stopped, failed) is never reported. Each line is one JSON object: a client's
hello (its rank, pid, host), the server's answer (rank 0's pid and host), then ``{"bye": true}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("mindwatch")

#: Seconds a connection or its hello may take.
CONNECT_SECS = 5.0
_BYE = b'{"bye":true}\n'


def local_address(towards: str | None) -> str:
    """This host's address on the interface that reaches ``towards`` (the launcher's master address), else loopback."""
    if towards:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((towards, 9))  # no packet is sent: this only picks the route
                return str(s.getsockname()[0])
        except OSError:
            pass
    return "127.0.0.1"


class LifelineServer:
    """Rank 0's side: accepts one connection per rank; ``on_gone(rank, hello)`` when one ends without ``bye``
    (on the lifeline's thread: keep it short)."""

    def __init__(self, host: str, *, me: dict[str, Any], on_gone: Callable[[int, dict[str, Any]], None]) -> None:
        self.me = me
        self.on_gone = on_gone
        self._sock = socket.create_server((host, 0))
        self._sock.setblocking(False)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._peers: dict[socket.socket, dict[str, Any]] = {}  # connection -> its hello ({} until it came)
        self._buffers: dict[socket.socket, bytes] = {}
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="mindwatch-lifeline", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closing:
            try:
                events = self._selector.select(timeout=0.5)
            except (OSError, ValueError):
                return
            for key, _ in events:
                if key.fileobj is self._sock:
                    self._accept()
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        conn.setblocking(False)
        self._peers[conn] = {}
        self._buffers[conn] = b""
        self._selector.register(conn, selectors.EVENT_READ, None)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, gone=True)
            return
        self._buffers[conn] += data
        while b"\n" in self._buffers[conn]:
            line, self._buffers[conn] = self._buffers[conn].split(b"\n", 1)
            msg = _decode(line)
            if msg.get("bye"):
                self._drop(conn, gone=False)
                return
            if isinstance(msg.get("rank"), int) and not self._peers[conn]:
                self._peers[conn] = msg
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps(self.me).encode() + b"\n")

    def _drop(self, conn: socket.socket, *, gone: bool) -> None:
        hello = self._peers.pop(conn, {})
        self._buffers.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        conn.close()
        if gone and hello and not self._closing:
            try:
                self.on_gone(int(hello["rank"]), hello)
            except Exception as e:  # never let a report end the lifeline
                log.warning("mindwatch: the lifeline could not report rank %s (%r)", hello.get("rank"), e)

    def close(self) -> None:
        """Say ``bye`` to every rank (this end is clean) and stop."""
        self._closing = True
        for conn in list(self._peers):
            try:
                conn.setblocking(True)
                conn.settimeout(0.5)
                conn.sendall(_BYE)
            except OSError:
                pass
            conn.close()
        self._peers.clear()
        self._sock.close()
        self._thread.join(timeout=2)
        self._selector.close()


class LifelineClient:
    """A rank > 0's side: one connection to rank 0; ``on_gone(rank 0's hello)`` when it ends without ``bye``."""

    def __init__(self, address: str, *, me: dict[str, Any], on_gone: Callable[[dict[str, Any]], None]) -> None:
        host, _, port = address.rpartition(":")
        self.on_gone = on_gone
        self._closing = False
        self._sock = socket.create_connection((host, int(port)), timeout=CONNECT_SECS)
        self._sock.sendall(json.dumps(me).encode() + b"\n")
        self.peer: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._watch, name="mindwatch-lifeline", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        buffer = b""
        self._sock.settimeout(None)
        while True:
            try:
                data = self._sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                break
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                msg = _decode(line)
                if msg.get("bye"):
                    self._closing = True
                elif not self.peer:
                    self.peer = msg
        if not self._closing:
            try:
                self.on_gone(self.peer)
            except Exception as e:
                log.warning("mindwatch: the lifeline could not report rank 0 (%r)", e)

    def close(self) -> None:
        """Say ``bye`` (this end is clean) and hang up."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.sendall(_BYE)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=2)


def _decode(line: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(line)
    except ValueError:
        return {}
    return msg if isinstance(msg, dict) else {}
