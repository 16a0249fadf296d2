"""A lifeline between rank 0 and every other rank: one TCP connection each, so a rank that dies is known at once,
on any host, with or without a shared file system.

Example::

    server = LifelineServer("10.0.0.1", me={"pid": os.getpid(), "host": "node0"}, on_gone=lambda rank, who: ...)
    server.address                      # "10.0.0.1:41873": rank 0 announces it in the train step's signal

    client = LifelineClient(server.address, me={"rank": 1, "pid": os.getpid(), "host": "node1"},
                            on_gone=lambda who: ...)   # rank 0's process ended without saying goodbye
    client.close({"state": "finished", "last_step": 300})  # a clean end says "bye": the other side raises nothing
    server.wait_for_byes(5.0)           # rank 0 at its end: until every connected rank said how it ended
    server.ends()                       # {1: {"state": "finished", "last_step": 300}}: the end-of-run message's facts

When a process ends, its kernel closes its sockets, so the other side reads the end of the stream within
milliseconds, whatever killed it (``kill -9``, the OOM killer, a crash). A host that vanishes (power, network) sends
nothing back: TCP keep-alive probes on every connection (:func:`keep_alive`) end it within ``keepalive_secs``, and
the other side reports that rank as ``unreachable``. A side that says ``bye``
first (its session closed: finished, stopped, failed) is never reported, and its ``bye`` says how it ended (its
state, last step and reason): rank 0 tells the run's end from what each rank said, not from status files that may
be on another node. Each line is one JSON object: a client's hello (its rank, pid, host, attempt), the server's
answer (rank 0's pid, host and attempt), then ``{"bye": true, "state": ..., "last_step": ..., "reason": ...}``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any

from mindwatch.store.sink import BaseSink

log = logging.getLogger("mindwatch")

#: Seconds a connection or its hello may take.
CONNECT_SECS = 5.0
#: The longest line a rank may send (a stack dump, as JSON).
MAX_LINE = 4 << 20
_BYE = b'{"bye":true}\n'


def _bye(end: dict[str, Any] | None) -> bytes:
    return json.dumps({"bye": True, **(end or {})}).encode() + b"\n"


def keep_alive(sock: socket.socket, secs: float) -> None:
    """Probe an idle connection so that a peer that stops answering ends it within about ``secs`` seconds: the first
    probe after a third of it, then one every sixth, four unanswered ending the connection (ETIMEDOUT)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval = max(1, int(secs / 3)), max(1, int(secs / 6))
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", 4)):
        if hasattr(socket, name):  # Linux; elsewhere the system's keep-alive defaults
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # unacknowledged data (a bye to a vanished host) gives up as soon
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(secs * 1000))


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

    def __init__(
        self,
        host: str,
        *,
        me: dict[str, Any],
        on_gone: Callable[[int, dict[str, Any]], None],
        keepalive_secs: float = 30.0,
        on_message: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        """``on_message(rank, message)``: any other line a rank sends (a stall's stack dump, :class:`StacksRelay`), on
        the lifeline's thread."""
        self.me = me
        self.on_gone = on_gone
        self.on_message = on_message
        self.keepalive_secs = keepalive_secs
        self._sock = socket.create_server((host, 0))
        self._sock.setblocking(False)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._peers: dict[socket.socket, dict[str, Any]] = {}  # connection -> its hello ({} until it came)
        self._buffers: dict[socket.socket, bytes] = {}
        #: How each rank that said ``bye`` ended: ``{rank: {"state", "last_step", "reason"}}``.
        self._ends: dict[int, dict[str, Any]] = {}
        self._changed = threading.Condition()
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
        keep_alive(conn, self.keepalive_secs)
        self._peers[conn] = {}
        self._buffers[conn] = b""
        self._selector.register(conn, selectors.EVENT_READ, None)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError as e:
            self._drop(conn, gone=True, how=_how(e))
            return
        if not data:
            self._drop(conn, gone=True)
            return
        self._buffers[conn] += data
        if len(self._buffers[conn]) > MAX_LINE:
            log.warning("mindwatch: a lifeline message over %d bytes from %s is dropped", MAX_LINE, self._peers[conn])
            self._buffers[conn] = self._buffers[conn].rsplit(b"\n", 1)[-1][-MAX_LINE:]
        while b"\n" in self._buffers[conn]:
            line, self._buffers[conn] = self._buffers[conn].split(b"\n", 1)
            msg = _decode(line)
            if msg.get("bye"):
                rank = self._peers[conn].get("rank")
                if isinstance(rank, int):
                    self._ends[rank] = {k: v for k, v in msg.items() if k != "bye"}
                self._drop(conn, gone=False)
                return
            if isinstance(msg.get("rank"), int) and not self._peers[conn]:
                self._peers[conn] = msg
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps(self.me).encode() + b"\n")
            elif self._peers[conn] and self.on_message is not None:
                try:
                    self.on_message(int(self._peers[conn]["rank"]), msg)
                except Exception as e:  # never let a message end the lifeline
                    log.warning("mindwatch: the lifeline could not take rank %s's message (%r)", self._peers[conn]["rank"], e)

    def _drop(self, conn: socket.socket, *, gone: bool, how: str = "disconnected") -> None:
        hello = {**self._peers.pop(conn, {}), "how": how}
        self._buffers.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn)
        conn.close()
        with self._changed:
            self._changed.notify_all()
        if gone and hello.get("rank") is not None and not self._closing:
            try:
                self.on_gone(int(hello["rank"]), hello)
            except Exception as e:  # never let a report end the lifeline
                log.warning("mindwatch: the lifeline could not report rank %s (%r)", hello.get("rank"), e)

    def broadcast(self, message: dict[str, Any], *, but: int | None = None) -> None:
        """Send every connected rank (except rank ``but``) one message; a rank whose line is down is skipped."""
        line = json.dumps(message).encode() + b"\n"
        for conn, hello in list(self._peers.items()):
            if hello and hello.get("rank") != but:
                with contextlib.suppress(OSError):  # a small line into an idle socket's buffer: never blocks
                    conn.sendall(line)

    def ends(self) -> dict[int, dict[str, Any]]:
        """How each other rank ended as it said in its ``bye``; a rank still connected is ``running``."""
        ends = dict(self._ends)
        for hello in list(self._peers.values()):
            rank = hello.get("rank")
            if isinstance(rank, int) and rank not in ends:
                ends[rank] = {"state": "running"}
        return ends

    def wait_for_byes(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s while a connected rank has not said how it ended (rank 0 at its own end: the ranks
        of one step end together); True when none is left. Returns at once when none is connected."""
        with self._changed:
            return self._changed.wait_for(lambda: not any(list(self._peers.values())), timeout)

    def close(self) -> None:
        """Say ``bye`` to every rank (this end is clean) and stop."""
        if self._closing:
            return
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

    def __init__(
        self,
        address: str,
        *,
        me: dict[str, Any],
        on_gone: Callable[[dict[str, Any]], None],
        keepalive_secs: float = 30.0,
        on_message: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """``on_message(message)``: any other line rank 0 sends (:meth:`LifelineServer.broadcast`), on the lifeline's
        thread."""
        host, _, port = address.rpartition(":")
        self.on_gone = on_gone
        self.on_message = on_message
        self._closing = False
        self._sock = socket.create_connection((host, int(port)), timeout=CONNECT_SECS)
        keep_alive(self._sock, keepalive_secs)
        self._sock.sendall(json.dumps(me).encode() + b"\n")
        self.peer: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._watch, name="mindwatch-lifeline", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        buffer = b""
        how = "disconnected"
        self._sock.settimeout(None)
        while True:
            try:
                data = self._sock.recv(4096)
            except OSError as e:
                data, how = b"", _how(e)
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
                elif self.on_message is not None:
                    try:
                        self.on_message(msg)
                    except Exception as e:  # never let a message end the lifeline
                        log.warning("mindwatch: the lifeline could not take rank 0's message (%r)", e)
        if not self._closing:
            try:
                self.on_gone({**self.peer, "how": how})
            except Exception as e:
                log.warning("mindwatch: the lifeline could not report rank 0 (%r)", e)

    def send(self, message: dict[str, Any]) -> bool:
        """Send rank 0 one message (a JSON object; its ``on_message`` gets it); False when the line is down."""
        try:
            self._sock.sendall(json.dumps(message).encode() + b"\n")
            return True
        except OSError:
            return False

    def close(self, end: dict[str, Any] | None = None) -> None:
        """Say ``bye`` with how this rank ended (``end``: its state, last step, reason) and hang up."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.sendall(_bye(end))
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=2)


class StacksRelay(BaseSink):
    """Sink on a rank > 0: the stack dump of its own stall goes to rank 0 over the lifeline (with the stall alert),
    so that rank 0's run directory holds every rank's dump and its hang diagnosis reads them, with or without a
    shared folder. ``client()``: this rank's lifeline (None until it joined)."""

    def __init__(self, rank: int, client: Callable[[], Any]) -> None:
        self.rank = rank
        self.client = client

    def alert(self, alert: dict[str, Any]) -> None:
        client = self.client()
        if alert.get("rule") != "stall" or alert.get("rank") != self.rank or not alert.get("stacks") or client is None:
            return
        try:
            with open(alert["stacks"], encoding="utf-8", errors="replace") as f:
                text = f.read(MAX_LINE // 2)
        except OSError as e:
            log.warning("mindwatch: cannot read the stack dump %s for rank 0 (%s)", alert["stacks"], e)
            return
        client.send({"stall": alert, "stacks_text": text})


def _how(error: OSError) -> str:
    """How a connection that failed ended: ``unreachable`` when its keep-alive probes went unanswered."""
    return "unreachable" if error.errno in (errno.ETIMEDOUT, errno.EHOSTUNREACH) else "disconnected"


def _decode(line: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(line)
    except ValueError:
        return {}
    return msg if isinstance(msg, dict) else {}
