"""How `kvx serve` runs the app under uvicorn: the HTTP layer's own limits, and what uvicorn lacks.

Uvicorn provides, and we use: `timeout_keep_alive` (an idle keep-alive connection is closed after a few
seconds) and `h11_max_incomplete_event_size` (request line plus headers are at most 16 KiB, or a 400).
What it lacks, `GuardedH11Protocol` adds, at the protocol level because the app never sees a request
whose headers have not all arrived:

- a header deadline: a connection must deliver a complete request line and headers within
  `header_timeout_s` of opening (or of its previous answer); a client that trickles bytes (slowloris)
  is closed. Uvicorn's keep-alive timer restarts on every byte received, so it cannot catch this.
- a connection cap below the open-file limit (less a reserve for the server's own files and one accept
  burst: asyncio stops accepting for a second when accept() fails with EMFILE). At the cap, a new connection evicts the connection that
  has waited longest without sending a complete request (slow or idle ones), so health checks and real
  clients get in while slow clients hold sockets; only when every connection is busy with a request is
  the newcomer closed. Uvicorn's `limit_concurrency` is not used: it still accepts and keeps the socket
  (a file descriptor) and answers 503 in plain text, so it does not protect the descriptor table.
- the 400 that h11 gives for a malformed request (bad chunk, header too large, bad request line) is
  JSON with nosniff and Connection: close, like every other answer, instead of uvicorn's plain text.

`RateLimitedLog` keeps a flood of identical log lines (EMFILE from accept, invalid requests) from filling
the disk: at most `burst` lines per message per minute, then one line counting what was dropped.
"""
from __future__ import annotations

import collections
import json
import logging
import resource
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0          # complete request line and headers within this of opening (or the last answer)
# uvicorn's idle keep-alive timeout: twice the Retry-After (5 s) the API sends, so that a client retrying after
# a 503 does not race the server closing its idle connection (a POST on a connection closed under it is lost).
KEEP_ALIVE_S = 10
MAX_HEADER_BYTES = 16 * 1024     # h11's incomplete-event limit: request line and headers together
BACKLOG = 64                     # listen backlog; asyncio also accepts up to this many sockets in one burst
# Descriptors kept free: the server's own files, pipes to job processes, logs, and one accept burst, since
# asyncio accepts a burst before any connection_made can evict (at EMFILE it stops accepting for a second).
FD_RESERVE = 64 + BACKLOG


def connection_cap(reserve: int = FD_RESERVE) -> int:
    """Connections the server keeps open at most: the soft open-file limit less a reserve."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(16, soft - reserve)


def _json_400(detail: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps({"detail": detail}).encode()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"x-content-type-options", b"nosniff"), (b"connection", b"close")], body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline, a connection cap that sheds slow clients, JSON 400s."""

    header_timeout_s = HEADER_TIMEOUT_S
    max_connections = 1000

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._start_waiting()
        if len(self.connections) > self.max_connections:
            victim = self._longest_waiting()
            (victim or self).transport.abort()

    def _awaiting_request(self) -> bool:
        """No request in progress: headers not yet complete, or idle after an answer."""
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    @property
    def _waiting(self) -> collections.OrderedDict:
        """The server's connections awaiting a request, longest waiting first (each enters at the back when its
        wait starts; an OrderedDict, whose front stays O(1) to reach however many left it). Shared through
        uvicorn's server state, so finding the one to evict at the cap is a look at the front, not a walk over
        every connection: with 1,100 slow clients against a cap of 896, that walk ran for each of the 200
        connections over the cap, about a millisecond each, in bursts that held health checks for tens of
        milliseconds."""
        state = self.server_state
        waiting = getattr(state, "kvx_waiting", None)
        if waiting is None:
            waiting = state.kvx_waiting = collections.OrderedDict()
        return waiting

    def _start_waiting(self) -> None:
        """Headers are due from now: the deadline starts, and the connection joins the back of the waiting (its
        place there is its age: no timestamp is kept)."""
        self._deadline = self.loop.call_later(self.header_timeout_s, self._header_timeout)
        waiting = self._waiting
        waiting[self] = None
        waiting.move_to_end(self)

    def _longest_waiting(self) -> H11Protocol | None:
        """The connection that has waited longest for a request's headers, other than this one (entries that
        stopped waiting or are closing are dropped as they are met)."""
        waiting, stale, found = self._waiting, [], None
        for c in waiting:
            if c is self:
                continue
            if c._awaiting_request() and not c.transport.is_closing():
                found = c
                break
            stale.append(c)
        for c in stale:
            del waiting[c]
        return found

    def _header_timeout(self) -> None:
        if self._awaiting_request() and not self.transport.is_closing():
            self.transport.abort()        # nothing to answer: the request never arrived

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
            self._deadline = None

    def handle_events(self) -> None:
        super().handle_events()
        if not self._awaiting_request():          # a complete request arrived: its headers are in
            self._disarm()
            self._waiting.pop(self, None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():       # the next request's headers get the same deadline
            self._disarm()
            self._start_waiting()

    def connection_lost(self, exc) -> None:
        self._disarm()
        self._waiting.pop(self, None)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        headers, body = _json_400("The request is not valid HTTP/1.1 (a malformed request line, header or "
                                  "chunk, or headers over 16 KiB); the connection is closed.")
        try:
            out = self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request"))
            out += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
            self.transport.write(out)
        except h11.LocalProtocolError:            # an answer had already begun: all we can do is close
            pass
        self.transport.close()


class RateLimitedLog(logging.Filter):
    """At most `burst` records per (logger, message template) per `window_s`, then one summary line."""

    def __init__(self, burst: int = 5, window_s: float = 60.0):
        super().__init__()
        self.burst, self.window_s = burst, window_s
        self.seen: dict[tuple[str, str], list] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        start, count, dropped = self.seen.get(key, (now, 0, 0))
        if now - start > self.window_s:
            if dropped:
                record.msg = f"{record.msg} [and {dropped} more like it in the last {self.window_s:g} s, not logged]"
            start, count, dropped = now, 0, 0
        if count >= self.burst:
            self.seen[key] = (start, count, dropped + 1)
            return False
        if len(self.seen) > 1000:                 # bounded: a flood of distinct messages cannot grow it
            self.seen.clear()
        self.seen[key] = (start, count + 1, dropped)
        return True


LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "asyncio", "kvx")


def rate_limit_logs(burst: int = 5, window_s: float = 60.0) -> RateLimitedLog:
    limiter = RateLimitedLog(burst, window_s)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.filters = [f for f in logger.filters if not isinstance(f, RateLimitedLog)]
        logger.addFilter(limiter)
    return limiter


class BytesSent:
    """ASGI wrapper that counts the bytes a server sends (status line, headers and bodies as sent, compressed
    where they were): what a page load costs on the wire. The page benchmark and the browser tests count at the
    server, so a load from the browser's cache counts 0 and nothing depends on how a browser reports its
    workers' requests."""

    def __init__(self, app):
        self.app, self.total = app, 0

    async def __call__(self, scope, receive, send):
        async def counted(message):
            if message["type"] == "http.response.start":
                self.total += 17 + sum(len(k) + len(v) + 4 for k, v in message.get("headers", []))
            elif message["type"] == "http.response.body":
                self.total += len(message.get("body", b""))
            await send(message)
        return await self.app(scope, receive, counted)

    def take(self) -> int:
        """The bytes counted since the last take."""
        out, self.total = self.total, 0
        return out


def server_config(app, host: str = "127.0.0.1", port: int = 8000, header_timeout_s: float = HEADER_TIMEOUT_S,
                  max_connections: int | None = None, log_level: str = "warning") -> uvicorn.Config:
    """The uvicorn configuration `kvx serve` uses (tests and the attack benchmark use it too)."""
    protocol = type("KvxH11Protocol", (GuardedH11Protocol,), {
        "header_timeout_s": header_timeout_s, "max_connections": max_connections or connection_cap()})
    config = uvicorn.Config(app, host=host, port=port, http=protocol, log_level=log_level,
                            timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            backlog=BACKLOG, server_header=False)
    rate_limit_logs()                             # after Config, which (re)configures uvicorn's loggers
    return config
