"""Connections that a slow or idle client cannot hold: a cap on open connections, and a deadline
for a request's headers.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) and bounds the size of
unfinished headers (``h11_max_incomplete_event_size``), but it waits forever for headers sent a
byte at a time, and it accepts connections until the process runs out of file descriptors (its
``limit_concurrency`` answers 503 only once a request's headers are in, by which time the socket is
open). A ``ConnectionGuard`` adds two rules, where sockets are made and where requests are read:

- the listening socket (``listener``) counts the connections it accepts; one more than
  ``max_connections`` aborts the oldest connection that is closing but stalled flushing an answer its
  client does not read (writes paused), else the oldest that is not being answered (reading its
  headers, or idle between requests) — or closes the new one, when every one is being answered. The
  process so holds at most ``max_connections`` client sockets, plus those closing in this turn of the
  event loop;
- the protocol (``protocol``, uvicorn's h11 one) closes a connection whose request headers have not
  all arrived ``header_timeout`` seconds after it opened (or after its previous answer), or whose
  body has not all arrived ``body_timeout`` seconds (and a grace second) after its headers, and
  aborts one whose answer has not drained for ``send_timeout`` seconds (asyncio's write buffer over
  its high-water mark all that time, the kernel's full: a client that reads nothing, or next to
  nothing, would otherwise hold its connection, and a place under the cap, for as long as it likes);
  that request is logged and counted "cut off", not by the status its answer began with.

A request h11 cannot parse is answered 400 as JSON (uvicorn's own answer is plain text). A route
that reads the body answers a slow one 408 first (``dependencies.read_body``); the
connection's own deadline also covers the routes that never read it (a 404, a ``GET`` with a body).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

CUT_OFF = "aiayn.cut_off"  # the scope key that marks a request whose answer the send timeout aborted
LEFT = "aiayn.left"  # the scope key of a streamed answer whose client left before its end (logged 499)


class ConnectionGuard:
    """At most ``max_connections`` open connections, ``header_timeout`` seconds for the headers of
    each request, ``body_timeout`` for its body and ``send_timeout`` for a stalled answer: give
    ``listener(sock)`` to ``uvicorn.Server.run(sockets=…)`` and ``protocol`` to ``uvicorn.Config(http=…)``."""

    def __init__(self, max_connections: int, header_timeout: float, body_timeout: float, send_timeout: float):
        self.max_connections, self.header_timeout = max_connections, header_timeout
        self.body_timeout = body_timeout + 1.0  # read_body's 408 comes first where a route reads it
        self.send_timeout = send_timeout
        self.open = 0  # client sockets accepted and not yet closed
        self.connections: set[H11Protocol] = set()  # those whose protocol has started
        self.protocol = _protocol(self)

    def listener(self, sock: socket.socket) -> socket.socket:
        """``sock`` (bound, not yet listening) as a socket whose ``accept`` keeps the cap."""
        return _Listener(self, sock)

    def accepted(self, conn: socket.socket) -> bool:
        """Count a new connection; make room for it by closing the oldest idle one, or say (False)
        that there is none and the new one must go."""
        self.open += 1
        if self.open <= self.max_connections:
            return True
        # closing, and its writes paused: the client is not reading what is left of its answer
        leaving = [c for c in self.connections if c.transport.is_closing() and c.stalled and not c.aborted]
        idle = [c for c in self.connections if _idle(c)]
        if leaving or idle:
            oldest = min(leaving or idle, key=lambda c: c.opened)
            oldest.aborted = True
            oldest.transport.abort()  # its socket closes this loop turn
            return True
        self.open -= 1
        return False

    def closed(self) -> None:
        self.open -= 1


class _Listener(socket.socket):
    """A listening socket that refuses (closes at once) the connections ``guard`` has no room for."""

    def __init__(self, guard: ConnectionGuard, sock: socket.socket):
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self.guard = guard

    def accept(self) -> tuple[socket.socket, object]:
        while True:  # asyncio accepts a burst of connections per turn of its loop
            conn, addr = super().accept()
            if self.guard.accepted(conn):
                return conn, addr
            conn.close()


def _protocol(guard: ConnectionGuard) -> type[H11Protocol]:
    class GuardedH11Protocol(H11Protocol):
        """uvicorn's h11 protocol with a deadline for each request's headers, then its body."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.opened = time.monotonic()
            self.aborted = False  # by the guard, to make room: its socket closes this loop turn
            self.deadline: asyncio.TimerHandle | None = None
            self.stalled: asyncio.TimerHandle | None = None  # while the client reads none of the answer
            guard.connections.add(self)
            self._expect(h11.IDLE, guard.header_timeout)

        def handle_events(self) -> None:
            super().handle_events()
            if self.waiting_for is h11.IDLE and self.conn.their_state is h11.SEND_BODY:
                self._expect(h11.SEND_BODY, guard.body_timeout)  # the headers are in; now the body
            elif self.deadline is not None and self.conn.their_state is not self.waiting_for:
                self.deadline.cancel()  # the request has arrived whole
                self.deadline = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            state = self.conn.their_state  # the next request, on a kept-alive connection (or pipelined)
            if not self.transport.is_closing() and state in (h11.IDLE, h11.SEND_BODY):
                self._expect(state, guard.header_timeout if state is h11.IDLE else guard.body_timeout)

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to a request h11 cannot parse (no Host, two lengths, a bad chunk, over
            16 KiB of headers), as JSON like every other error instead of plain text."""
            body = json.dumps({"error": msg}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]  # fmt: skip
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body), h11.EndOfMessage()):  # fmt: skip
                self.transport.write(self.conn.send(event))
            self.transport.close()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self.stalled is None:
                self.stalled = self.loop.call_later(guard.send_timeout, self._cut_off)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self.stalled is not None:
                self.stalled.cancel()
                self.stalled = None

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self.deadline, self.stalled):
                if timer is not None:
                    timer.cancel()
            if self in guard.connections:
                guard.connections.discard(self)
                guard.closed()
            super().connection_lost(exc)

        def _cut_off(self) -> None:
            """Abort a connection whose client read none of its answer for ``send_timeout`` seconds,
            and mark the request being answered (``CUT_OFF`` in its scope), so that its log line and
            metrics do not count it as answered."""
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.scope[CUT_OFF] = True
            self.transport.abort()

        def _expect(self, state: type[h11.IDLE], seconds: float) -> None:
            """Close the connection unless the client has left ``state`` (IDLE: still sending the
            headers; SEND_BODY: the body) within ``seconds``."""
            if self.deadline is not None:
                self.deadline.cancel()
            self.waiting_for = state
            self.deadline = self.loop.call_later(seconds, self._late, state)

        def _late(self, state: type[h11.IDLE]) -> None:
            if self.conn.their_state is state and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


def _idle(connection: H11Protocol) -> bool:
    """Not answering a request (reading its headers, or waiting for the next one), nor closing."""
    cycle = connection.cycle
    return not connection.transport.is_closing() and (cycle is None or cycle.response_complete)
