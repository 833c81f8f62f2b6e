"""
The asyncio client: the same names and semantics as `rollbox.client`, awaited. Runs on
httpx (`pip install 'rollbox[async]'`), HTTP/1.1 with a bounded pool whose idle
connections expire before the gateway's keep-alive timeout.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, TypeVar, Union
from urllib.parse import quote, urlencode

try:
    import httpx
except ImportError as err:  # pragma: no cover
    raise ImportError("rollbox.aio needs httpx: pip install 'rollbox[async]'") from err

from . import _core as core
from ._core import USER_AGENT, Command
from ._tar import extract_tar, tar_of_dir
from .aio_batches import AsyncBatches
from .aio_rollouts import AsyncRollouts
from .images import AsyncImages, layer_upload_request
from .errors import CommandFailed, ConnectionFailed, RollboxError, Timeout, error_from_answer
from .types import CommandStatus, ExecResult, RunResult, StreamEvent

T = TypeVar("T")


class AsyncRollbox:
    """One per event loop. Pickles to its base URL, token and options (connections open lazily)."""

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None, *, timeouts: Optional[core.Timeouts] = None,
                 retry: Optional[core.RetryPolicy] = None, max_connections: int = 64):
        self.base_url = (base_url or os.environ.get("ROLLBOX_URL") or "http://127.0.0.1:8080").rstrip("/")
        self.token = token if token is not None else os.environ.get("ROLLBOX_TOKEN", "")
        self.timeouts = timeouts or core.Timeouts()
        self.retry = retry or core.RetryPolicy()
        self.max_connections = max_connections
        self._http: Optional[httpx.AsyncClient] = None
        self._pid = os.getpid()
        self.sandboxes = AsyncSandboxes(self)
        self.jobs = AsyncJobs(self)
        self.layers = AsyncLayers(self)
        self.batches = AsyncBatches(self)
        self.rollouts = AsyncRollouts(self)
        self.images = AsyncImages(self)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> "AsyncRollbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __getstate__(self) -> Dict[str, Any]:
        return {"base_url": self.base_url, "token": self.token, "timeouts": self.timeouts, "retry": self.retry, "max_connections": self.max_connections}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["base_url"], state["token"], timeouts=state["timeouts"], retry=state["retry"], max_connections=state["max_connections"])  # type: ignore[misc]

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._http = httpx.AsyncClient(
                base_url=self.base_url,
                http2=False,  # one stream per connection: no HTTP/2 stream limit to hit at high concurrency
                limits=httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections,
                                    keepalive_expiry=core.DEFAULT_KEEPALIVE_S),
                timeout=httpx.Timeout(self.timeouts.read, connect=self.timeouts.connect, pool=None),
            )
        return self._http

    def sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        return AsyncSandbox(self, sandbox_id)

    async def run(self, cmd: Command, *, image: Optional[Union[str, Mapping[str, Any]]] = None, files: Optional[Mapping[str, Union[bytes, str]]] = None,
                  fetch: Optional[Sequence[str]] = None, stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                  timeout: Optional[float] = None, resources: Optional[Mapping[str, Any]] = None, network: Optional[Mapping[str, Any]] = None,
                  workdir: Optional[str] = None) -> RunResult:
        request = core.run_request(cmd=cmd, image=image, files=files, fetch=fetch, stdin=stdin, env=env, timeout=timeout,
                                   resources=resources, network=network, workdir=workdir, timeouts=self.timeouts)
        return RunResult.from_json(await self._call(request))

    def _timeout(self, request: core.Request) -> httpx.Timeout:
        return httpx.Timeout(request.read_timeout or self.timeouts.read, connect=self.timeouts.connect, pool=None)

    async def _send_once(self, request: core.Request) -> httpx.Response:
        try:
            # A streamed body (an async iterator, no Content-Length) is sent chunked, pulled as it goes.
            content = request.stream.async_chunks() if request.stream is not None else request.encoded()
            response = await self.http.request(request.method, request.path, content=content,
                                               headers=request.all_headers(self.token, USER_AGENT), timeout=self._timeout(request))
        except (httpx.ConnectError, httpx.ConnectTimeout) as err:
            raise ConnectionFailed(f"cannot reach {self.base_url}: {err}", maybe_sent=False) from err
        except httpx.ReadTimeout as err:
            raise Timeout(f"no answer within {request.read_timeout or self.timeouts.read:.0f} s", code="timeout") from err
        except httpx.TransportError as err:
            raise ConnectionFailed(f"connection failed before an answer: {err}") from err
        if response.status_code >= 400:
            raise error_from_answer(response.status_code, response.content, response.headers.get("retry-after"))
        return response

    async def _call(self, request: core.Request) -> Any:
        started = time.monotonic()
        for attempt in range(1, 1_000_000):
            try:
                response = await self._send_once(request)
                return core.decode(request, response.headers, response.content)
            except RollboxError as error:
                if not await self._retry_wait(error, request, attempt, started):
                    raise
        raise AssertionError("unreachable")

    async def _events(self, make_request: Callable[[str], core.Request], last_event_id: str, convert: Callable[[Dict[str, Any]], Optional[T]],
                      last_event: str) -> AsyncIterator[T]:
        """As the sync client's `_events`: a stream resumed from its last event id, with backoff, up to its `last_event`."""
        attempt, started = 0, time.monotonic()
        while True:
            attempt += 1
            request = make_request(last_event_id)
            try:
                try:
                    async with self.http.stream(request.method, request.path, content=request.encoded(), headers=request.all_headers(self.token, USER_AGENT),
                                                timeout=self._timeout(request)) as response:
                        if response.status_code >= 400:
                            raise error_from_answer(response.status_code, await response.aread(), response.headers.get("retry-after"))
                        parser = core.SseParser()
                        async for line in response.aiter_lines():
                            raw = parser.feed(line)
                            if raw is None:
                                continue
                            if raw["id"]:
                                last_event_id = raw["id"]
                            item = convert(raw)
                            if item is not None:
                                yield item
                                attempt = 0  # progress: a later drop starts its retries afresh
                            if raw["event"] == last_event:
                                return
                except (httpx.ConnectError, httpx.ConnectTimeout) as err:
                    raise ConnectionFailed(f"cannot reach {self.base_url}: {err}", maybe_sent=False) from err
                except httpx.TransportError as err:
                    raise ConnectionFailed(f"event stream dropped: {err}") from err
                raise ConnectionFailed(f"the event stream ended before its {last_event} event")
            except RollboxError as error:
                if not await self._retry_wait(error, request, max(attempt, 1), started):
                    raise

    async def _retry_wait(self, error: RollboxError, request: core.Request, attempt: int, started: float) -> bool:
        if not core.should_retry(error, request):
            return False
        delay = self.retry.delay(attempt, error)
        if request.retry_for is not None and not isinstance(error, ConnectionFailed):
            if time.monotonic() - started + delay > request.retry_for:
                return False
        elif attempt >= self.retry.attempts:
            return False
        await asyncio.sleep(delay)
        return True


class AsyncSandboxes:
    def __init__(self, client: AsyncRollbox):
        self._client = client

    async def create(self, *, image: Optional[Union[str, Mapping[str, Any]]] = None, resources: Optional[Mapping[str, Any]] = None,
                     network: Optional[Mapping[str, Any]] = None, hidden_paths: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None,
                     labels: Optional[Mapping[str, str]] = None, job: Optional[str] = None, workdir: Optional[str] = None,
                     ttl_seconds: Optional[int] = None, sandbox_class: Optional[str] = None, idempotency_key: Optional[str] = None) -> "AsyncSandbox":
        request = core.create_request(image=image, resources=resources, network=network, hidden_paths=hidden_paths, env=env, labels=labels,
                                      job=job, workdir=workdir, ttl_seconds=ttl_seconds, sandbox_class=sandbox_class,
                                      idempotency_key=idempotency_key, timeouts=self._client.timeouts)
        record = await self._client._call(request)
        return AsyncSandbox(self._client, record["id"], record)

    async def fork_snapshot(self, digest: str, count: int, *, resources: Optional[Mapping[str, Any]] = None, network: Optional[Mapping[str, Any]] = None,
                      env: Optional[Mapping[str, str]] = None, labels: Optional[Mapping[str, str]] = None, job: Optional[str] = None,
                      workdir: Optional[str] = None, ttl_seconds: Optional[int] = None, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """`count` children on a snapshot (the digest `snapshot()` answered), with the settings a create takes; the answer as `Sandbox.fork`'s."""
        fields = {"resources": resources, "network": network, "env": env, "labels": labels, "job": job, "workdir": workdir, "ttlSeconds": ttl_seconds}
        return await self._client._call(core.fork_request(core.snapshot_path(digest, "/fork"), count, fields, idempotency_key=idempotency_key, timeouts=self._client.timeouts))

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        return AsyncSandbox(self._client, sandbox_id, await self._client._call(core.Request("GET", core.sandbox_path(sandbox_id))))

    async def list(self, *, job: Optional[str] = None, label: Optional[str] = None, state: Optional[str] = None) -> List["AsyncSandbox"]:
        query = urlencode({k: v for k, v in (("job", job), ("label", label), ("state", state)) if v is not None})
        answer = await self._client._call(core.Request("GET", f"/v1/sandboxes?{query}"))
        return [AsyncSandbox(self._client, r["id"], r) for r in answer["sandboxes"]]


class AsyncSandbox:
    def __init__(self, client: AsyncRollbox, sandbox_id: str, record: Optional[Dict[str, Any]] = None):
        self._client = client
        self.id = sandbox_id
        self.record: Dict[str, Any] = record or {"id": sandbox_id}
        self.files = AsyncFiles(client, sandbox_id)

    def __reduce__(self):
        return (_restore_sandbox, (self._client.__getstate__(), self.id))

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, state={self.record.get('state')!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.delete()

    @property
    def state(self) -> Optional[str]:
        return self.record.get("state")

    async def exec(self, cmd: Command, *, stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   timeout: Optional[float] = None, command_id: Optional[str] = None, check: bool = False) -> ExecResult:
        body = core.exec_body(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, command_id=command_id)
        result = ExecResult.from_json(await self._client._call(core.exec_request(self.id, body, self._client.timeouts)))
        if check and not result.ok:
            raise CommandFailed(result)
        return result

    async def stream(self, cmd: Command, *, stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                     timeout: Optional[float] = None, command_id: Optional[str] = None) -> AsyncIterator[StreamEvent]:
        body = core.exec_body(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, command_id=command_id)
        async for event in self._client._events(lambda last: core.exec_request(self.id, body, self._client.timeouts, stream=True, last_event_id=last), "0",
                                                lambda raw: core.stream_event(raw, body["commandId"]), "exit"):
            yield event

    async def follow(self, command_id: str) -> AsyncIterator[StreamEvent]:
        """A running (or ended) command's output from its start, as it comes (a pty's as `pty` events), then its `exit`."""
        async for event in self._client._events(lambda last: core.follow_request(self.id, command_id, self._client.timeouts, last), "0",
                                                lambda raw: core.stream_event(raw, command_id), "exit"):
            yield event

    async def pty(self, cmd: Optional[Command] = None, *, cols: int = 80, rows: int = 24, env: Optional[Mapping[str, str]] = None,
                  cwd: Optional[str] = None, user: Optional[str] = None, timeout: Optional[float] = None,
                  command_id: Optional[str] = None) -> CommandStatus:
        """Starts a command on a terminal (default: the image's shell); see the sync client's `pty`."""
        body = core.pty_body(cmd, cols=cols, rows=rows, env=env, cwd=cwd, user=user, timeout=timeout, command_id=command_id)
        return CommandStatus.from_json(await self._client._call(core.pty_request(self.id, body)))

    async def resize(self, command_id: str, cols: int, rows: int) -> Dict[str, Any]:
        """A running pty command's new size (its foreground process group gets SIGWINCH)."""
        return await self._client._call(core.resize_request(self.id, command_id, cols, rows))

    async def exec_background(self, cmd: Command, *, stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                              cwd: Optional[str] = None, timeout: Optional[float] = None, command_id: Optional[str] = None,
                        stdin_open: bool = False) -> CommandStatus:
        body = core.exec_body(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, command_id=command_id, background=True, stdin_open=stdin_open)
        return CommandStatus.from_json(await self._client._call(core.exec_request(self.id, body, self._client.timeouts)))

    async def command(self, command_id: str) -> CommandStatus:
        return CommandStatus.from_json(await self._client._call(core.Request("GET", core.sandbox_path(self.id, f"/commands/{quote(command_id, safe='')}"))))

    async def signal(self, command_id: str, signal: str = "TERM") -> Dict[str, Any]:
        """Sends a signal (TERM, KILL, INT, ...) to a running command's process group."""
        return await self._client._call(core.signal_request(self.id, command_id, signal))

    async def write_stdin(self, command_id: str, data: str, *, eof: bool = False) -> Dict[str, Any]:
        """Writes to the stdin of a running command started with `stdin_open=True`; `eof` closes it."""
        return await self._client._call(core.stdin_request(self.id, command_id, data, eof))

    async def commands(self, limit: int = 1000) -> List[Dict[str, Any]]:
        """The first `limit` commands of the log; `iter_commands` reads it all."""
        return (await self.command_page(limit=limit))["commands"]

    async def command_page(self, after: Optional[str] = None, limit: int = 1000) -> Dict[str, Any]:
        """One page of the command log: `{"commands": [...], "nextCursor": ...}` (no nextCursor: nothing after it yet)."""
        return await self._client._call(core.commands_request(self.id, limit, after))

    async def iter_commands(self, page_size: int = 1000) -> AsyncIterator[Dict[str, Any]]:
        """The whole command log, oldest first, fetched a page at a time (`async for`)."""
        after: Optional[str] = None
        while True:
            page = await self.command_page(after, page_size)
            for command in page["commands"]:
                yield command
            after = page.get("nextCursor")
            if after is None:
                return

    async def refresh(self) -> "AsyncSandbox":
        self.record = await self._client._call(core.Request("GET", core.sandbox_path(self.id)))
        return self

    async def metrics(self) -> Dict[str, Any]:
        """One sample of CPU, memory and disk use from the sandbox's cgroups (`cpuUsedPct` since the previous sample)."""
        return await self._client._call(core.Request("GET", core.sandbox_path(self.id, "/metrics")))

    async def pause(self, mode: str = "freeze") -> "AsyncSandbox":
        self.record = await self._client._call(core.Request("POST", core.sandbox_path(self.id, "/pause"), {"mode": mode}, replayable=False))
        return self

    async def resume(self) -> "AsyncSandbox":
        self.record = await self._client._call(core.Request("POST", core.sandbox_path(self.id, "/resume"), replayable=False))
        return self

    async def snapshot(self, name: Optional[str] = None, exclude: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if exclude is not None:
            body["exclude"] = list(exclude)
        return await self._client._call(core.Request("POST", core.sandbox_path(self.id, "/snapshot"), body, replayable=False))

    async def fork(self, count: int, *, labels: Optional[Mapping[str, str]] = None, network: Optional[Mapping[str, Any]] = None,
             ttl_seconds: Optional[int] = None, resources: Optional[Mapping[str, Any]] = None, idempotency_key: Optional[str] = None,
             snapshot: Union[bool, str] = False, processes: Optional[bool] = None) -> Dict[str, Any]:
        """
        `count` (1-64) children from this sandbox's current state (running, paused or
        hibernated): the answer lists them in order (`id`, `state`, or a coded `error` for one
        refused), with `forkPoint` (children on the parent's host start from clones of its
        disk, or a microVM's saved image) and/or `forkLayer` (the fork point packed as a
        layer), `parentFrozenMs` and `processes` (True: every child is the parent's microVM
        restored, processes and all, with `detachedCommands` that were running; False: files,
        not processes). Labels, network, TTL and each resource limit given replace the
        parent's. `snapshot` (True, or a name): also keep the fork point as a snapshot layer,
        to fork from it again later. `processes`: None for the tier's way (a microVM keeps
        them), False for files only. Retried with one Idempotency-Key: a retry answers the
        same children.
        """
        kept = None if snapshot is False else ({} if snapshot is True else {"name": snapshot})
        fields = {"labels": labels, "network": network, "ttlSeconds": ttl_seconds, "resources": resources, "snapshot": kept, "processes": processes}
        return await self._client._call(core.fork_request(core.sandbox_path(self.id, "/fork"), count, fields, idempotency_key=idempotency_key, timeouts=self._client.timeouts))

    async def set_policy(self, *, network: Optional[Mapping[str, Any]] = None, hidden_paths: Optional[Sequence[str]] = None) -> "AsyncSandbox":
        body: Dict[str, Any] = {}
        if network is not None:
            body["network"] = network
        if hidden_paths is not None:
            body["hiddenPaths"] = list(hidden_paths)
        self.record = await self._client._call(core.Request("PATCH", core.sandbox_path(self.id, "/policy"), body))
        return self

    async def delete(self) -> "AsyncSandbox":
        self.record = await self._client._call(core.Request("DELETE", core.sandbox_path(self.id)))
        return self


def _restore_sandbox(client_state: Dict[str, Any], sandbox_id: str) -> AsyncSandbox:
    client = AsyncRollbox.__new__(AsyncRollbox)
    client.__setstate__(client_state)
    return AsyncSandbox(client, sandbox_id)


class AsyncFiles:
    def __init__(self, client: AsyncRollbox, sandbox_id: str):
        self._client, self._id = client, sandbox_id

    async def read(self, path: str) -> bytes:
        return await self._client._call(core.files_request(self._id, "GET", path))

    async def write(self, path: str, data: Union[bytes, str], mode: Optional[str] = None) -> Dict[str, Any]:
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return await self._client._call(core.files_request(self._id, "PUT", path, content=content, mode=mode))

    async def read_tar(self, path: str) -> bytes:
        return await self._client._call(core.files_request(self._id, "GET", path, tar=True))

    async def write_tar(self, path: str, tar: bytes) -> Dict[str, Any]:
        return await self._client._call(core.files_request(self._id, "PUT", path, content=tar, tar=True))

    async def upload(self, local_dir: str, remote_dir: str) -> Dict[str, Any]:
        return await self.write_tar(remote_dir, tar_of_dir(local_dir))

    async def download(self, remote_dir: str, local_dir: str) -> None:
        extract_tar(await self.read_tar(remote_dir), local_dir)


class AsyncJobs:
    def __init__(self, client: AsyncRollbox):
        self._client = client

    async def pause(self, job: str, mode: str = "freeze") -> Dict[str, Any]:
        return await self._client._call(core.Request("POST", f"/v1/jobs/{quote(job, safe='')}/pause", {"mode": mode}))

    async def resume(self, job: str) -> Dict[str, Any]:
        return await self._client._call(core.Request("POST", f"/v1/jobs/{quote(job, safe='')}/resume"))


class AsyncLayers:
    def __init__(self, client: AsyncRollbox):
        self._client = client

    async def upload(self, tar: Union[bytes, str], name: Optional[str] = None) -> Dict[str, Any]:
        return await self._client._call(layer_upload_request(tar, name))

    async def list(self) -> List[Dict[str, Any]]:
        return (await self._client._call(core.Request("GET", "/v1/layers")))["layers"]

    async def get(self, ref: str) -> Dict[str, Any]:
        return await self._client._call(core.Request("GET", f"/v1/layers/{quote(ref, safe='')}"))
