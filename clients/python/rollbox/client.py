"""The synchronous client (standard library only). `rollbox.aio` has the same names, async."""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

from . import _core as core
from ._core import USER_AGENT, Command
from ._tar import extract_tar, tar_of_dir
from ._transport import SyncTransport
from .batches import Batches
from .rollouts import Rollouts
from .images import Images, layer_upload_request
from .errors import CommandFailed, ConnectionFailed, RollboxError
from .types import CommandStatus, ExecResult, RunResult, StreamEvent

T = TypeVar("T")



class Rollbox:
    """
    A client of one rollbox gateway. Thread-safe; one per process is plenty (it keeps a
    bounded pool of keep-alive connections). Pickles to its base URL, token and options:
    connections are opened lazily in whichever process uses it.
    """

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None, *, timeouts: Optional[core.Timeouts] = None,
                 retry: Optional[core.RetryPolicy] = None, max_connections: int = 64):
        self.base_url = (base_url or os.environ.get("ROLLBOX_URL") or "http://127.0.0.1:8080").rstrip("/")
        self.token = token if token is not None else os.environ.get("ROLLBOX_TOKEN", "")
        self.timeouts = timeouts or core.Timeouts()
        self.retry = retry or core.RetryPolicy()
        self.max_connections = max_connections
        self._transport: Optional[SyncTransport] = None
        self.sandboxes = Sandboxes(self)
        self.jobs = Jobs(self)
        self.layers = Layers(self)
        self.batches = Batches(self)
        self.rollouts = Rollouts(self)
        self.images = Images(self)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def __enter__(self) -> "Rollbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> Dict[str, Any]:
        return {"base_url": self.base_url, "token": self.token, "timeouts": self.timeouts, "retry": self.retry, "max_connections": self.max_connections}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["base_url"], state["token"], timeouts=state["timeouts"], retry=state["retry"], max_connections=state["max_connections"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"Rollbox({self.base_url!r})"

    @property
    def transport(self) -> SyncTransport:
        if self._transport is None:
            self._transport = SyncTransport(self.base_url, self.timeouts, self.max_connections)
        return self._transport

    # -- calls -----------------------------------------------------------------------------
    def sandbox(self, sandbox_id: str) -> "Sandbox":
        """A handle on an existing sandbox (no call is made)."""
        return Sandbox(self, sandbox_id)

    def run(self, cmd: Command, *, image: Optional[Union[str, Mapping[str, Any]]] = None, files: Optional[Mapping[str, Union[bytes, str]]] = None,
            fetch: Optional[Sequence[str]] = None, stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
            timeout: Optional[float] = None, resources: Optional[Mapping[str, Any]] = None, network: Optional[Mapping[str, Any]] = None,
            workdir: Optional[str] = None) -> RunResult:
        """One command in a fresh sandbox, discarded afterwards (the function-call tier)."""
        request = core.run_request(cmd=cmd, image=image, files=files, fetch=fetch, stdin=stdin, env=env, timeout=timeout,
                                   resources=resources, network=network, workdir=workdir, timeouts=self.timeouts)
        return RunResult.from_json(self._call(request))

    def _call(self, request: core.Request) -> Any:
        headers = request.all_headers(self.token, USER_AGENT)
        started = time.monotonic()
        for attempt in range(1, 1_000_000):
            try:
                answer = self.transport.send(request, headers)
                return core.decode(request, answer.headers, answer.body)
            except RollboxError as error:
                if not self._retry_wait(error, request, attempt, started):
                    raise
        raise AssertionError("unreachable")

    def _events(self, make_request: Callable[[str], core.Request], last_event_id: str, convert: Callable[[Dict[str, Any]], Optional[T]],
                last_event: str) -> Iterator[T]:
        """
        An event stream's events as `convert` makes them (None: not handed out), up to its
        `last_event`. A dropped stream is asked for again from the last event id seen
        (`make_request(id)`), after the client's backoff; its tries start afresh after each
        event handed out, so a stream cut again and again with nothing between gives up after
        `RetryPolicy.attempts`. An error answer (not_found, forbidden) is raised as it is.
        """
        attempt, started = 0, time.monotonic()
        while True:
            attempt += 1
            request = make_request(last_event_id)
            try:
                parser = core.SseParser()
                for line in core.lines_of(self.transport.stream(request, request.all_headers(self.token, USER_AGENT))):
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
                raise ConnectionFailed(f"the event stream ended before its {last_event} event")
            except RollboxError as error:
                if not self._retry_wait(error, request, max(attempt, 1), started):
                    raise

    def _retry_wait(self, error: RollboxError, request: core.Request, attempt: int, started: float) -> bool:
        """Sleeps before the next try and says True, or says False (give up: raise it)."""
        if not core.should_retry(error, request):
            return False
        delay = self.retry.delay(attempt, error)
        if request.retry_for is not None and not isinstance(error, ConnectionFailed):
            if time.monotonic() - started + delay > request.retry_for:
                return False
        elif attempt >= self.retry.attempts:
            return False
        time.sleep(delay)
        return True


class Sandboxes:
    def __init__(self, client: Rollbox):
        self._client = client

    def create(self, *, image: Optional[Union[str, Mapping[str, Any]]] = None, resources: Optional[Mapping[str, Any]] = None,
               network: Optional[Mapping[str, Any]] = None, hidden_paths: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None,
               labels: Optional[Mapping[str, str]] = None, job: Optional[str] = None, workdir: Optional[str] = None,
               ttl_seconds: Optional[int] = None, sandbox_class: Optional[str] = None, idempotency_key: Optional[str] = None) -> "Sandbox":
        """
        A running sandbox. `idempotency_key` (generated when not given) is sent on every
        retry, so a create is done once however often it is retried; 429/503 answers (quota,
        no capacity) are waited out up to `Timeouts.create`.
        """
        request = core.create_request(image=image, resources=resources, network=network, hidden_paths=hidden_paths, env=env, labels=labels,
                                      job=job, workdir=workdir, ttl_seconds=ttl_seconds, sandbox_class=sandbox_class,
                                      idempotency_key=idempotency_key, timeouts=self._client.timeouts)
        record = self._client._call(request)
        return Sandbox(self._client, record["id"], record)

    def fork_snapshot(self, digest: str, count: int, *, resources: Optional[Mapping[str, Any]] = None, network: Optional[Mapping[str, Any]] = None,
                      env: Optional[Mapping[str, str]] = None, labels: Optional[Mapping[str, str]] = None, job: Optional[str] = None,
                      workdir: Optional[str] = None, ttl_seconds: Optional[int] = None, idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """`count` children on a snapshot (the digest `snapshot()` answered), with the settings a create takes; the answer as `Sandbox.fork`'s."""
        fields = {"resources": resources, "network": network, "env": env, "labels": labels, "job": job, "workdir": workdir, "ttlSeconds": ttl_seconds}
        return self._client._call(core.fork_request(core.snapshot_path(digest, "/fork"), count, fields, idempotency_key=idempotency_key, timeouts=self._client.timeouts))

    def get(self, sandbox_id: str) -> "Sandbox":
        return Sandbox(self._client, sandbox_id, self._client._call(core.Request("GET", core.sandbox_path(sandbox_id))))

    def list(self, *, job: Optional[str] = None, label: Optional[str] = None, state: Optional[str] = None) -> List["Sandbox"]:
        from urllib.parse import urlencode

        query = urlencode({k: v for k, v in (("job", job), ("label", label), ("state", state)) if v is not None})
        answer = self._client._call(core.Request("GET", f"/v1/sandboxes?{query}"))
        return [Sandbox(self._client, r["id"], r) for r in answer["sandboxes"]]


class Sandbox:
    """A handle on one sandbox: its id and its last known record. Pickles to base URL, token and id."""

    def __init__(self, client: Rollbox, sandbox_id: str, record: Optional[Dict[str, Any]] = None):
        self._client = client
        self.id = sandbox_id
        self.record: Dict[str, Any] = record or {"id": sandbox_id}
        self.files = Files(client, sandbox_id)

    def __reduce__(self):
        return (_restore_sandbox, (self._client.__getstate__(), self.id))

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, state={self.record.get('state')!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.delete()

    @property
    def state(self) -> Optional[str]:
        return self.record.get("state")

    def exec(self, cmd: Command, *, stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             timeout: Optional[float] = None, command_id: Optional[str] = None, check: bool = False) -> ExecResult:
        """
        Runs a command (a string goes to `/bin/sh -c`, a list is an argv) and waits for it.
        `timeout` is the command's (seconds; the server kills it and answers `timed_out`).
        Re-sending a `command_id` returns the recorded result (`replayed`) without running it
        again. `check=True` raises CommandFailed on a non-zero exit or a timeout.
        """
        body = core.exec_body(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, command_id=command_id)
        result = ExecResult.from_json(self._client._call(core.exec_request(self.id, body, self._client.timeouts)))
        if check and not result.ok:
            raise CommandFailed(result)
        return result

    def stream(self, cmd: Command, *, stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
               timeout: Optional[float] = None, command_id: Optional[str] = None) -> Iterator[StreamEvent]:
        """
        Output as it is produced: `stdout`/`stderr` events, then one `exit` event with the
        result. A dropped stream is resumed with the same command id and the last event id
        seen: the command runs once, and no chunk is lost or repeated. Also follows a
        background command: pass its `command_id`.
        """
        body = core.exec_body(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, command_id=command_id)
        return self._client._events(lambda last: core.exec_request(self.id, body, self._client.timeouts, stream=True, last_event_id=last), "0",
                                    lambda raw: core.stream_event(raw, body["commandId"]), "exit")

    def follow(self, command_id: str) -> Iterator[StreamEvent]:
        """A running (or ended) command's output from its start, as it comes (a pty's as `pty` events), then its `exit`."""
        return self._client._events(lambda last: core.follow_request(self.id, command_id, self._client.timeouts, last), "0",
                                    lambda raw: core.stream_event(raw, command_id), "exit")

    def pty(self, cmd: Optional[Command] = None, *, cols: int = 80, rows: int = 24, env: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None, user: Optional[str] = None, timeout: Optional[float] = None,
            command_id: Optional[str] = None) -> CommandStatus:
        """
        Starts a command on a terminal (default: the image's shell) and returns at once:
        `follow` its output, type with `write_stdin`, `resize` it, end it with `signal`.
        """
        body = core.pty_body(cmd, cols=cols, rows=rows, env=env, cwd=cwd, user=user, timeout=timeout, command_id=command_id)
        return CommandStatus.from_json(self._client._call(core.pty_request(self.id, body)))

    def resize(self, command_id: str, cols: int, rows: int) -> Dict[str, Any]:
        """A running pty command's new size (its foreground process group gets SIGWINCH)."""
        return self._client._call(core.resize_request(self.id, command_id, cols, rows))

    def exec_background(self, cmd: Command, *, stdin: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                        cwd: Optional[str] = None, timeout: Optional[float] = None, command_id: Optional[str] = None,
                        stdin_open: bool = False) -> CommandStatus:
        """Starts a command and returns at once; follow it with `command(id)` or `stream(..., command_id=id)`."""
        body = core.exec_body(cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, command_id=command_id, background=True, stdin_open=stdin_open)
        return CommandStatus.from_json(self._client._call(core.exec_request(self.id, body, self._client.timeouts)))

    def command(self, command_id: str) -> CommandStatus:
        from urllib.parse import quote

        return CommandStatus.from_json(self._client._call(core.Request("GET", core.sandbox_path(self.id, f"/commands/{quote(command_id, safe='')}"))))

    def signal(self, command_id: str, signal: str = "TERM") -> Dict[str, Any]:
        """Sends a signal (TERM, KILL, INT, ...) to a running command's process group."""
        return self._client._call(core.signal_request(self.id, command_id, signal))

    def write_stdin(self, command_id: str, data: str, *, eof: bool = False) -> Dict[str, Any]:
        """Writes to the stdin of a running command started with `stdin_open=True`; `eof` closes it."""
        return self._client._call(core.stdin_request(self.id, command_id, data, eof))

    def commands(self, limit: int = 1000) -> List[Dict[str, Any]]:
        """The first `limit` commands of the log (trajectory): argv, times, state and result; `iter_commands` reads it all."""
        return self.command_page(limit=limit)["commands"]

    def command_page(self, after: Optional[str] = None, limit: int = 1000) -> Dict[str, Any]:
        """One page of the command log: `{"commands": [...], "nextCursor": ...}` (no nextCursor: nothing after it yet)."""
        return self._client._call(core.commands_request(self.id, limit, after))

    def iter_commands(self, page_size: int = 1000) -> Iterator[Dict[str, Any]]:
        """The whole command log, oldest first, fetched a page at a time."""
        after: Optional[str] = None
        while True:
            page = self.command_page(after, page_size)
            yield from page["commands"]
            after = page.get("nextCursor")
            if after is None:
                return

    def refresh(self) -> "Sandbox":
        self.record = self._client._call(core.Request("GET", core.sandbox_path(self.id)))
        return self

    def metrics(self) -> Dict[str, Any]:
        """One sample of CPU, memory and disk use from the sandbox's cgroups (`cpuUsedPct` since the previous sample)."""
        return self._client._call(core.Request("GET", core.sandbox_path(self.id, "/metrics")))

    def pause(self, mode: str = "freeze") -> "Sandbox":
        """`freeze` (CPU stopped, memory kept), `swap` (frozen, memory paged out to the host's swap, processes kept) or `hibernate` (writable layer packed, memory freed, processes end)."""
        self.record = self._client._call(core.Request("POST", core.sandbox_path(self.id, "/pause"), {"mode": mode}, replayable=False))
        return self

    def resume(self) -> "Sandbox":
        self.record = self._client._call(core.Request("POST", core.sandbox_path(self.id, "/resume"), replayable=False))
        return self

    def snapshot(self, name: Optional[str] = None, exclude: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """The writable layer as a new layer (scope sandbox:snapshot); returns the layer record."""
        body: Dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if exclude is not None:
            body["exclude"] = list(exclude)
        return self._client._call(core.Request("POST", core.sandbox_path(self.id, "/snapshot"), body, replayable=False))

    def fork(self, count: int, *, labels: Optional[Mapping[str, str]] = None, network: Optional[Mapping[str, Any]] = None,
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
        return self._client._call(core.fork_request(core.sandbox_path(self.id, "/fork"), count, fields, idempotency_key=idempotency_key, timeouts=self._client.timeouts))

    def set_policy(self, *, network: Optional[Mapping[str, Any]] = None, hidden_paths: Optional[Sequence[str]] = None) -> "Sandbox":
        """A new task stage: the given network policy and/or hidden paths replace the current ones."""
        body: Dict[str, Any] = {}
        if network is not None:
            body["network"] = network
        if hidden_paths is not None:
            body["hiddenPaths"] = list(hidden_paths)
        self.record = self._client._call(core.Request("PATCH", core.sandbox_path(self.id, "/policy"), body))
        return self

    def delete(self) -> "Sandbox":
        self.record = self._client._call(core.Request("DELETE", core.sandbox_path(self.id)))
        return self


def _restore_sandbox(client_state: Dict[str, Any], sandbox_id: str) -> Sandbox:
    client = Rollbox.__new__(Rollbox)
    client.__setstate__(client_state)
    return Sandbox(client, sandbox_id)


class Files:
    """Files of a running sandbox (paths resolve inside it)."""

    def __init__(self, client: Rollbox, sandbox_id: str):
        self._client, self._id = client, sandbox_id

    def read(self, path: str) -> bytes:
        return self._client._call(core.files_request(self._id, "GET", path))

    def write(self, path: str, data: Union[bytes, str], mode: Optional[str] = None) -> Dict[str, Any]:
        """Writes a file (parents created); `mode` like "0755"."""
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return self._client._call(core.files_request(self._id, "PUT", path, content=content, mode=mode))

    def read_tar(self, path: str) -> bytes:
        return self._client._call(core.files_request(self._id, "GET", path, tar=True))

    def write_tar(self, path: str, tar: bytes) -> Dict[str, Any]:
        return self._client._call(core.files_request(self._id, "PUT", path, content=tar, tar=True))

    def upload(self, local_dir: str, remote_dir: str) -> Dict[str, Any]:
        """A local directory's contents into `remote_dir` (created if missing), as one tar."""
        return self.write_tar(remote_dir, tar_of_dir(local_dir))

    def download(self, remote_dir: str, local_dir: str) -> None:
        """A sandbox directory's contents into `local_dir` (unsafe entries refused)."""
        extract_tar(self.read_tar(remote_dir), local_dir)


class Jobs:
    def __init__(self, client: Rollbox):
        self._client = client

    def pause(self, job: str, mode: str = "freeze") -> Dict[str, Any]:
        """Every live sandbox labelled with this training job, on every host; each one's outcome."""
        from urllib.parse import quote

        return self._client._call(core.Request("POST", f"/v1/jobs/{quote(job, safe='')}/pause", {"mode": mode}))

    def resume(self, job: str) -> Dict[str, Any]:
        from urllib.parse import quote

        return self._client._call(core.Request("POST", f"/v1/jobs/{quote(job, safe='')}/resume"))


class Layers:
    def __init__(self, client: Rollbox):
        self._client = client

    def upload(self, tar: Union[bytes, str], name: Optional[str] = None) -> Dict[str, Any]:
        """A rootfs tar (bytes, or a path to one, streamed) as a content-addressed layer; returns its record."""
        return self._client._call(layer_upload_request(tar, name))

    def list(self) -> List[Dict[str, Any]]:
        return self._client._call(core.Request("GET", "/v1/layers"))["layers"]

    def get(self, ref: str) -> Dict[str, Any]:
        from urllib.parse import quote

        return self._client._call(core.Request("GET", f"/v1/layers/{quote(ref, safe='')}"))
