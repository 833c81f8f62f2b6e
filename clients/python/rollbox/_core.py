"""What the sync and async clients share: requests as data, the retry rule, SSE parsing."""
from __future__ import annotations

import json
import random
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Union
from urllib.parse import quote, urlencode

from .errors import ConnectionFailed, RollboxError
from .types import ExecResult, StreamEvent

#: A command: a shell line (run by `sh -c`) or an argv list.
Command = Union[str, Sequence[str]]
USER_AGENT = "rollbox-python/0.1.0"

#: Statuses retried (with Retry-After honoured): the request was not served, and may be later.
RETRY_STATUSES = frozenset({429, 503})
#: Idle connections are dropped this long before the gateway's own keep-alive timeout
#: (its `Keep-Alive: timeout=N` answer header), so a request never races the server's close.
KEEPALIVE_MARGIN_S = 1.0
#: Idle lifetime of a connection when the gateway did not say (Node's default is 5 s).
DEFAULT_KEEPALIVE_S = 4.0


@dataclass
class Timeouts:
    """Three different waits, kept apart (seconds)."""

    #: Opening a TCP connection to the gateway.
    connect: float = 10.0
    #: An HTTP answer to a plain call (everything but a command or a create).
    read: float = 60.0
    #: A create in all, queueing included: 429/503 answers (quota, no capacity) are retried until then.
    create: float = 300.0
    #: Added to a command's own timeout for the HTTP wait of its exec (the command's timeout is the server's).
    command_margin: float = 30.0


@dataclass
class RetryPolicy:
    """Tries for infrastructure failures only (429/503, a connection that failed before an answer)."""

    attempts: int = 8
    base_delay: float = 0.1
    max_delay: float = 5.0

    def delay(self, attempt: int, error: RollboxError) -> float:
        """Exponential backoff with jitter, never shorter than the server's Retry-After."""
        backoff = min(self.max_delay, self.base_delay * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
        return max(backoff, error.retry_after or 0.0)


@dataclass
class Request:
    method: str
    path: str
    body: Any = None
    #: Raw bytes (a file, a tar) instead of a JSON body.
    content: Optional[bytes] = None
    headers: Dict[str, str] = field(default_factory=dict)
    #: A body produced as it is sent, chunked (NDJSON tasks, an image archive): `chunks()`,
    #: `async_chunks()`, and `started` once it cannot be sent again.
    stream: Optional[Any] = None
    #: Safe to send again after it may have arrived (a GET, PUT or DELETE, a create with its
    #: Idempotency-Key, an exec with its commandId). Anything else is retried only when it
    #: certainly did not arrive.
    replayable: bool = True
    #: The HTTP read timeout of this call, when not Timeouts.read.
    read_timeout: Optional[float] = None
    #: Keep retrying 429/503 until this many seconds have passed (a create's queue wait), not just `attempts` times.
    retry_for: Optional[float] = None
    #: "json", "bytes" or "none".
    expect: str = "json"
    #: An answer read its own way (a page of batch results): called with the headers and body instead.
    parse: Optional[Callable[[Mapping[str, str], bytes], Any]] = None

    def encoded(self) -> Optional[bytes]:
        if self.content is not None:
            return self.content
        return None if self.body is None else json.dumps(self.body, separators=(",", ":")).encode("utf-8")

    def all_headers(self, token: str, user_agent: str) -> Dict[str, str]:
        h = {"authorization": f"Bearer {token}", "user-agent": user_agent, "accept": "application/json"}
        if self.content is not None:
            h["content-type"] = "application/octet-stream"
        elif self.body is not None:
            h["content-type"] = "application/json"
        h.update(self.headers)
        return h


def should_retry(error: RollboxError, request: Request) -> bool:
    if request.stream is not None and request.stream.started:
        return False  # its tasks were consumed (some perhaps sent): it cannot be sent again as it was
    if isinstance(error, ConnectionFailed):
        return not error.maybe_sent or request.replayable
    return error.status in RETRY_STATUSES


def keepalive_seconds(header: Optional[str]) -> float:
    """How long an idle connection may be reused, from the answer's `Keep-Alive: timeout=N`."""
    m = re.search(r"timeout=(\d+)", header or "")
    if not m:
        return DEFAULT_KEEPALIVE_S
    return max(0.0, int(m.group(1)) - KEEPALIVE_MARGIN_S)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sandbox_path(sandbox_id: str, tail: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{tail}"


# -- requests, one function per API call (both clients send exactly these) ------------------


def create_request(
    *,
    image: Optional[Union[str, Mapping[str, Any]]],
    resources: Optional[Mapping[str, Any]],
    network: Optional[Mapping[str, Any]],
    hidden_paths: Optional[Sequence[str]],
    env: Optional[Mapping[str, str]],
    labels: Optional[Mapping[str, str]],
    job: Optional[str],
    workdir: Optional[str],
    ttl_seconds: Optional[int],
    sandbox_class: Optional[str],
    idempotency_key: Optional[str],
    timeouts: Timeouts,
) -> Request:
    body: Dict[str, Any] = {}
    if image is not None:
        body["image"] = {"base": image, "layers": []} if isinstance(image, str) else dict(image)
    for key, value in (
        ("resources", resources), ("network", network), ("hiddenPaths", hidden_paths), ("env", env), ("labels", labels),
        ("job", job), ("workdir", workdir), ("ttlSeconds", ttl_seconds), ("class", sandbox_class),
    ):
        if value is not None:
            body[key] = list(value) if key == "hiddenPaths" else value
    # Generated when not given, and the same on every retry: one create, whatever is retried.
    key = idempotency_key or new_id("py")
    return Request("POST", "/v1/sandboxes", body, headers={"idempotency-key": key}, retry_for=timeouts.create, read_timeout=timeouts.create)


def fork_request(
    path: str,
    count: int,
    fields: Mapping[str, Any],
    *,
    idempotency_key: Optional[str],
    timeouts: Timeouts,
) -> Request:
    """A fork (`path`: a sandbox's or a snapshot's fork route); the fields left as None are left out (the parent's apply)."""
    body: Dict[str, Any] = {"count": count}
    for key, value in fields.items():
        if value is not None:
            body[key] = value
    # One key on every retry: one fork (one pack of the parent, one set of children), however often it is retried.
    key = idempotency_key or new_id("py-fork")
    return Request("POST", path, body, headers={"idempotency-key": key}, retry_for=timeouts.create, read_timeout=timeouts.create)


def snapshot_path(digest: str, tail: str = "") -> str:
    return f"/v1/snapshots/{quote(digest, safe=':')}{tail}"


def exec_body(cmd: Union[str, Sequence[str]], *, stdin: Optional[str], env: Optional[Mapping[str, str]], cwd: Optional[str],
              timeout: Optional[float], command_id: Optional[str], background: bool = False, stdin_open: bool = False) -> Dict[str, Any]:
    body: Dict[str, Any] = {"cmd": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}
    if stdin is not None:
        body["stdin"] = stdin
    if stdin_open:
        body["stdinOpen"] = True
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if timeout is not None:
        body["timeoutMs"] = max(1, int(timeout * 1000))
    if background:
        body["background"] = True
    # A command id makes re-sending it safe: the log answers with the recorded result.
    body["commandId"] = command_id or new_id("py")
    return body


def commands_request(sandbox_id: str, limit: int, after: Optional[str]) -> Request:
    """One page of the command log: `after` a `nextCursor` of the page before (None: from the first)."""
    from urllib.parse import urlencode

    query = {"limit": str(int(limit))}
    if after is not None:
        query["after"] = after
    return Request("GET", sandbox_path(sandbox_id, f"/commands?{urlencode(query)}"))


def command_path(sandbox_id: str, command_id: str, suffix: str) -> str:
    from urllib.parse import quote

    return sandbox_path(sandbox_id, f"/commands/{quote(command_id, safe='')}{suffix}")


def signal_request(sandbox_id: str, command_id: str, signal: str) -> Request:
    """A signal by name (TERM, KILL, INT, HUP, ...; a leading SIG is dropped)."""
    name = signal.upper()
    return Request("POST", command_path(sandbox_id, command_id, "/signal"), {"signal": name[3:] if name.startswith("SIG") else name})


def stdin_request(sandbox_id: str, command_id: str, data: str, eof: bool) -> Request:
    # Not sent again once it may have arrived: the same bytes twice would be another stdin.
    return Request("POST", command_path(sandbox_id, command_id, "/stdin"), {"data": data, "eof": eof}, replayable=False)


def pty_body(cmd: Optional[Union[str, Sequence[str]]], *, cols: int, rows: int, env: Optional[Mapping[str, str]], cwd: Optional[str],
             user: Optional[str], timeout: Optional[float], command_id: Optional[str]) -> Dict[str, Any]:
    """POST /v1/sandboxes/:id/pty: no cmd runs the image's shell."""
    body: Dict[str, Any] = {"cols": int(cols), "rows": int(rows)}
    if cmd is not None:
        body.update({"cmd": cmd} if isinstance(cmd, str) else {"argv": list(cmd)})
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = user
    if timeout is not None:
        body["timeoutMs"] = max(1, int(timeout * 1000))
    body["commandId"] = command_id or new_id("pty")
    return body


def pty_request(sandbox_id: str, body: Dict[str, Any]) -> Request:
    return Request("POST", sandbox_path(sandbox_id, "/pty"), body)


def resize_request(sandbox_id: str, command_id: str, cols: int, rows: int) -> Request:
    return Request("POST", command_path(sandbox_id, command_id, "/resize"), {"cols": int(cols), "rows": int(rows)})


def follow_request(sandbox_id: str, command_id: str, timeouts: Timeouts, last_event_id: str = "0") -> Request:
    """A command's output as server-sent events, from after `last_event_id`, then its exit."""
    return Request("GET", command_path(sandbox_id, command_id, ""), headers={"accept": "text/event-stream", "last-event-id": last_event_id},
                   read_timeout=timeouts.read)


def exec_request(sandbox_id: str, body: Dict[str, Any], timeouts: Timeouts, *, stream: bool = False, last_event_id: str = "0") -> Request:
    command_s = body.get("timeoutMs", 60_000) / 1000
    headers = {"accept": "text/event-stream", "last-event-id": last_event_id} if stream else {}
    read_timeout = timeouts.read if body.get("background") else command_s + timeouts.command_margin
    return Request("POST", sandbox_path(sandbox_id, "/exec"), body, headers=headers, read_timeout=read_timeout)


def files_request(sandbox_id: str, method: str, path: str, *, content: Optional[bytes] = None, tar: bool = False, mode: Optional[str] = None) -> Request:
    query: Dict[str, str] = {"path": path}
    if mode is not None:
        query["mode"] = mode
    if tar and method == "GET":
        query["format"] = "tar"
    headers = {"content-type": "application/x-tar" if tar else "application/octet-stream"} if content is not None else {"accept": "*/*"}
    return Request(method, sandbox_path(sandbox_id, f"/files?{urlencode(query)}"), content=content, headers=headers, expect="bytes" if method == "GET" else "json")


def run_request(*, cmd: Union[str, Sequence[str]], image: Optional[Union[str, Mapping[str, Any]]], files: Optional[Mapping[str, Union[bytes, str]]],
                fetch: Optional[Sequence[str]], stdin: Optional[str], env: Optional[Mapping[str, str]], timeout: Optional[float],
                resources: Optional[Mapping[str, Any]], network: Optional[Mapping[str, Any]], workdir: Optional[str], timeouts: Timeouts) -> Request:
    import base64

    body: Dict[str, Any] = {"cmd": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}
    if image is not None:
        body["image"] = {"base": image, "layers": []} if isinstance(image, str) else dict(image)
    if files:
        body["files"] = {p: base64.b64encode(c.encode("utf-8") if isinstance(c, str) else c).decode("ascii") for p, c in files.items()}
    for key, value in (("fetch", fetch), ("stdin", stdin), ("env", env), ("resources", resources), ("network", network), ("workdir", workdir)):
        if value is not None:
            body[key] = list(value) if key == "fetch" else value
    if timeout is not None:
        body["timeoutMs"] = max(1, int(timeout * 1000))
    # Not replayable: a run has no id, so only a request that surely did not arrive is sent again
    # (an `infra_error` answer is the platform's failure and is safe to retry by the caller).
    return Request("POST", "/v1/run", body, replayable=False, read_timeout=body.get("timeoutMs", 30_000) / 1000 + timeouts.command_margin)


# -- server-sent events --------------------------------------------------------------------------


class SseParser:
    """Incremental parser of an event stream: feed it lines, it hands back complete events."""

    def __init__(self) -> None:
        self.event, self.data, self.id = "message", [], None  # type: str, List[str], Optional[str]

    def feed(self, line: str) -> Optional[Dict[str, Any]]:
        line = line.rstrip("\r\n")
        if line == "":
            if not self.data and self.event == "message":
                return None
            out = {"event": self.event, "data": "\n".join(self.data), "id": self.id}
            self.event, self.data, self.id = "message", [], None
            return out
        if line.startswith(":"):
            return None  # a comment (keep-alive)
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        elif name == "id":
            self.id = value
        return None


def stream_event(raw: Dict[str, Any], command_id: str) -> Optional[StreamEvent]:
    if raw["event"] == "exit":
        d = json.loads(raw["data"])
        return StreamEvent("exit", result=ExecResult.from_json({"stdout": "", "stderr": "", "commandId": command_id, **d}))
    if raw["event"] in ("stdout", "stderr"):
        return StreamEvent(raw["event"], data=raw["data"])
    if raw["event"] == "pty":  # a terminal's output, as a JSON string (its carriage returns kept)
        return StreamEvent("pty", data=json.loads(raw["data"]))
    return None


def parse_json(body: bytes) -> Any:
    return json.loads(body.decode("utf-8")) if body else None


def decode(request: Request, headers: Mapping[str, str], body: bytes) -> Any:
    """What a call answers, as its request expects it (headers lower-case, or httpx's)."""
    if request.parse is not None:
        return request.parse(headers, body)
    if request.expect == "json":
        return parse_json(body)
    return body


def lines_of(chunks: Iterator[bytes]) -> Iterator[str]:
    """Text lines of a byte stream (an SSE body)."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line, buffer = buffer[: end + 1], buffer[end + 1 :]
            yield line.decode("utf-8")


Parse = Callable[[Any], Any]


class Caller(Protocol):
    """What a sub-client of the sync client (batches, images) calls through."""

    timeouts: Timeouts

    def _call(self, request: Request) -> Any: ...


class AsyncCaller(Protocol):
    """What a sub-client of the asyncio client calls through."""

    timeouts: Timeouts

    def _call(self, request: Request) -> Awaitable[Any]: ...
