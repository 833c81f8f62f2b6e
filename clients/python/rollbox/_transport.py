"""The synchronous transport: a bounded pool of keep-alive connections (standard library only)."""
from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from typing import Dict, Iterator, List, Optional
from urllib.parse import urlsplit

from ._core import Request, Timeouts, keepalive_seconds
from .errors import ConnectionFailed, Timeout, error_from_answer

#: Errors of a reused idle connection the server had already closed: the request never reached it.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class _Conn:
    def __init__(self, conn: http.client.HTTPConnection):
        self.conn = conn
        self.idle_until = 0.0
        self.reused = False


class Answer:
    def __init__(self, status: int, headers: Dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body


class SyncTransport:
    """
    At most `max_connections` connections, each reused while younger than the gateway's
    keep-alive timeout minus a margin (so the client never sends on a connection the server
    is closing). Created lazily and per process: after a fork (multiprocessing, Ray workers)
    the child opens its own connections and never touches the parent's sockets.
    """

    def __init__(self, base_url: str, timeouts: Timeouts, max_connections: int):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port], got {base_url!r}")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeouts = timeouts
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._idle: List[_Conn] = []
        self._pid = os.getpid()
        #: Connections opened so far (tests and benchmarks read it).
        self.opened = 0

    def _fresh_after_fork(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the parent's sockets are not ours to use
            self._lock = threading.Lock()
            self._slots = threading.BoundedSemaphore(self.max_connections)
            self._idle = []
            self._pid = os.getpid()

    def _checkout(self) -> _Conn:
        self._fresh_after_fork()
        self._slots.acquire()
        now = time.monotonic()
        with self._lock:
            while self._idle:
                c = self._idle.pop()
                if c.idle_until > now:
                    c.reused = True
                    return c
                c.conn.close()
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        self.opened += 1
        return _Conn(cls(self.host, self.port, timeout=self.timeouts.connect))

    def _checkin(self, c: _Conn, keep: bool, keepalive_header: Optional[str]) -> None:
        try:
            if keep:
                c.idle_until = time.monotonic() + keepalive_seconds(keepalive_header)
                with self._lock:
                    self._idle.append(c)
            else:
                c.conn.close()
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.conn.close()

    def _send(self, c: _Conn, request: Request, headers: Dict[str, str], read_timeout: float) -> http.client.HTTPResponse:
        conn = c.conn
        try:
            if conn.sock is None:
                conn.connect()
            conn.sock.settimeout(read_timeout)
            # A streamed body (an iterator, no Content-Length) is sent chunked, pulled as it goes.
            body = request.stream.chunks() if request.stream is not None else request.encoded()
            conn.request(request.method, self.prefix + request.path, body=body, headers=headers)
        except socket.timeout as err:
            raise ConnectionFailed(f"connecting to {self.host}:{self.port} timed out: {err}", maybe_sent=False) from err
        except (ConnectionRefusedError, socket.gaierror) as err:
            raise ConnectionFailed(f"cannot reach {self.host}:{self.port}: {err}", maybe_sent=False) from err
        except _STALE as err:
            raise ConnectionFailed(f"connection closed while sending: {err}", maybe_sent=not c.reused) from err
        except OSError as err:
            raise ConnectionFailed(f"sending to {self.host}:{self.port} failed: {err}") from err
        try:
            return conn.getresponse()
        except socket.timeout as err:
            raise Timeout(f"no answer within {read_timeout:.0f} s", code="timeout") from err
        except http.client.RemoteDisconnected as err:
            # The server closes an idle keep-alive connection only between requests: on a reused
            # one, a close with not a byte of answer means this request was never read.
            raise ConnectionFailed(f"connection closed before an answer: {err}", maybe_sent=not c.reused) from err
        except (OSError, http.client.HTTPException) as err:
            raise ConnectionFailed(f"connection failed before an answer: {err}") from err

    def send(self, request: Request, headers: Dict[str, str]) -> Answer:
        c = self._checkout()
        keep = False
        keepalive: Optional[str] = None
        try:
            resp = self._send(c, request, headers, request.read_timeout or self.timeouts.read)
            try:
                body = resp.read()
            except (OSError, http.client.HTTPException) as err:
                raise ConnectionFailed(f"connection dropped during the answer: {err}") from err
            keepalive = resp.getheader("keep-alive")
            keep = not resp.will_close
            answer = Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
        finally:
            self._checkin(c, keep, keepalive)
        if answer.status >= 400:
            raise error_from_answer(answer.status, answer.body, answer.headers.get("retry-after"))
        return answer

    def stream(self, request: Request, headers: Dict[str, str]) -> Iterator[bytes]:
        """The answer's body as it arrives (an event stream); the connection is held until it ends."""
        c = self._checkout()
        keep = False
        keepalive: Optional[str] = None
        try:
            resp = self._send(c, request, headers, request.read_timeout or self.timeouts.read)
            if resp.status >= 400:
                body = resp.read()
                raise error_from_answer(resp.status, body, resp.getheader("retry-after"))
            try:
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    yield chunk
            except (OSError, http.client.HTTPException) as err:
                raise ConnectionFailed(f"event stream dropped: {err}") from err
            keepalive = resp.getheader("keep-alive")
            keep = not resp.will_close
        finally:
            # A stream left before its end (the caller broke out) cannot be reused.
            self._checkin(c, keep, keepalive)

