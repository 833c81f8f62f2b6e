"""What the sync and async clients share for batches: the submit request (JSON or streamed NDJSON), paths, result paging."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional
from urllib.parse import quote, urlencode

from ._core import Request, Timeouts, decode
from .types import TERMINAL_BATCH_STATES, BatchResult, FollowedRollout, Trajectory

#: A streamed NDJSON submit is stored as it is read; its answer comes after the last line.
SUBMIT_READ_TIMEOUT_S = 600.0
#: Bytes of NDJSON gathered before they are sent as one chunk.
NDJSON_CHUNK_BYTES = 64 * 1024
#: A results follower's long-poll (the gateway's most is 60 s).
RESULTS_WAIT_S = 30.0

def batch_path(batch_id: str, tail: str = "") -> str:
    return f"/v1/batches/{quote(batch_id, safe='')}{tail}"


class NdjsonBody:
    """
    Tasks as NDJSON, encoded as the transport pulls them (one task a line, sent in chunks of
    about 64 KiB), so a batch of 50,000 tasks is never one string. One-shot: it consumes its
    iterable, and `started` says a send began (after which the request cannot be retried).
    """

    def __init__(self, tasks: Any):
        self._tasks = tasks
        self.started = False
        #: Tasks encoded so far.
        self.count = 0
        self._buffer: List[bytes] = []
        self._size = 0

    def _start(self) -> None:
        if self.started:
            raise RuntimeError("a streamed batch body can be sent once only (its tasks were consumed)")
        self.started = True

    def _add(self, task: Any) -> Optional[bytes]:
        """The task as a line; answers a chunk once about NDJSON_CHUNK_BYTES are gathered."""
        self.count += 1
        try:
            line = json.dumps(task, separators=(",", ":")).encode("utf-8") + b"\n"
        except (TypeError, ValueError) as err:
            raise TypeError(f"task {self.count} of the batch is not JSON: {err}") from err
        self._buffer.append(line)
        self._size += len(line)
        return self._flush() if self._size >= NDJSON_CHUNK_BYTES else None

    def _flush(self) -> Optional[bytes]:
        chunk = b"".join(self._buffer) if self._buffer else None
        self._buffer, self._size = [], 0
        return chunk

    def chunks(self) -> Iterator[bytes]:
        """For the sync transport (http.client sends an iterator chunked)."""
        if hasattr(self._tasks, "__aiter__") and not hasattr(self._tasks, "__iter__"):
            raise TypeError("the sync client needs a (sync) iterable of tasks; use rollbox.aio for an async one")
        self._start()
        for task in self._tasks:
            chunk = self._add(task)
            if chunk:
                yield chunk
        chunk = self._flush()
        if chunk:
            yield chunk

    async def async_chunks(self) -> AsyncIterator[bytes]:
        """For httpx: tasks from an async iterable, or a sync one."""
        if not hasattr(self._tasks, "__aiter__"):
            for chunk in self.chunks():
                yield chunk
            return
        self._start()
        async for task in self._tasks:
            chunk = self._add(task)
            if chunk:
                yield chunk
        chunk = self._flush()
        if chunk:
            yield chunk


def batch_options(*, max_concurrency: Optional[int], max_attempts: Optional[int], completion_window_seconds: Optional[int],
                  sandbox_class: Optional[str], metadata: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    options: Dict[str, Any] = {}
    for key, value in (("maxConcurrency", max_concurrency), ("maxAttempts", max_attempts),
                       ("completionWindowSeconds", completion_window_seconds), ("class", sandbox_class), ("metadata", metadata)):
        if value is not None:
            options[key] = dict(value) if key == "metadata" else value
    return options


def submit_request(tasks: Any, options: Dict[str, Any]) -> Request:
    """
    A list (or tuple) of tasks goes as one JSON body; any other iterable (a generator, an
    async iterable for rollbox.aio) as NDJSON, streamed, the options in the query. Not
    replayable: a batch has no idempotency key, so a submit is sent again only when it
    certainly did not arrive (and a streamed one only when none of its tasks was pulled).
    """
    if isinstance(tasks, (str, bytes, Mapping)):
        raise TypeError("tasks must be a list or an iterable of task dicts")
    if isinstance(tasks, (list, tuple)):
        return Request("POST", "/v1/batches", {**options, "tasks": list(tasks)}, replayable=False, read_timeout=SUBMIT_READ_TIMEOUT_S)
    if not hasattr(tasks, "__iter__") and not hasattr(tasks, "__aiter__"):
        raise TypeError(f"tasks must be a list or an iterable of task dicts, not {type(tasks).__name__}")
    query = {k: json.dumps(v, separators=(",", ":")) if k == "metadata" else str(v) for k, v in options.items()}
    path = "/v1/batches" + (f"?{urlencode(query)}" if query else "")
    return Request("POST", path, stream=NdjsonBody(tasks), headers={"content-type": "application/x-ndjson"},
                   replayable=False, read_timeout=SUBMIT_READ_TIMEOUT_S)


@dataclass
class ResultsPage:
    lines: List[BatchResult]
    #: The last line's cursor (`x-rollbox-cursor`), or the one asked after.
    cursor: Optional[str]
    #: The batch's state when the page was read (`x-rollbox-batch-state`).
    state: Optional[str]


def results_page(headers: Mapping[str, str], body: bytes) -> ResultsPage:
    lines = [BatchResult.from_json(json.loads(line)) for line in body.decode("utf-8").split("\n") if line.strip()]
    return ResultsPage(lines, headers.get("x-rollbox-cursor") or None, headers.get("x-rollbox-batch-state"))


class ResultsFollower:
    """
    The reading of a batch's results, page after page from a cursor; both clients drive it.
    Following, an empty page long-polls (`wait_seconds`); it is done when a read after the
    last line returns none and the batch had ended. Each page is one GET with `after` = the
    last line handed out, retried as any GET is: a dropped answer is read again from the
    same cursor, so no line is lost or repeated.
    """

    def __init__(self, batch_id: str, *, after: Optional[str], follow: bool, wait_seconds: float, limit: int, timeouts: Timeouts):
        self.batch_id, self.cursor, self.follow = batch_id, after, follow
        # Following never polls in a tight loop: at least 1 s of long-poll, at most the gateway's 60.
        self.wait_seconds = max(1.0, min(60.0, float(wait_seconds))) if follow else 0.0
        self.limit, self.timeouts = limit, timeouts
        self.finished = False

    def request(self) -> Optional[Request]:
        if self.finished:
            return None
        query: Dict[str, Any] = {"limit": int(self.limit)}
        if self.cursor:
            query["after"] = self.cursor
        if self.wait_seconds:
            query["waitSeconds"] = f"{self.wait_seconds:g}"
        return Request("GET", batch_path(self.batch_id, f"/results?{urlencode(query)}"), headers={"accept": "application/x-ndjson"},
                       parse=results_page, read_timeout=self.wait_seconds + self.timeouts.read)

    def take(self, page: ResultsPage) -> List[BatchResult]:
        if page.lines:
            self.cursor = page.lines[-1].cursor
        elif not self.follow or page.state in TERMINAL_BATCH_STATES:
            self.finished = True
        return page.lines


def rollout_path(rollout_id: str, tail: str = "") -> str:
    return f"/v1/rollouts/{quote(rollout_id, safe='')}{tail}"


def rollout_submit_request(task: Mapping[str, Any], options: Dict[str, Any]) -> Request:
    """`POST /v1/rollouts`: one task (with `agent` and `model`), run as a batch of one. Not replayable (no idempotency key)."""
    if not isinstance(task, Mapping):
        raise TypeError(f"a rollout's task is a dict, not {type(task).__name__}")
    return Request("POST", "/v1/rollouts", {**options, "task": dict(task)}, replayable=False)


def rollout_events_request(batch_id: str, last_event_id: str, timeouts: Timeouts) -> Request:
    """
    The batch's events stream with trajectories (`GET /v1/batches/:id/events?trajectory=true`),
    after the cursor `last_event_id` ("" from the first). The gateway writes at least every
    15 s (a comment while nothing ends), so the read timeout only catches a dead connection.
    """
    headers = {"accept": "text/event-stream", **({"last-event-id": last_event_id} if last_event_id else {})}
    return Request("GET", batch_path(batch_id, "/events?trajectory=true"), headers=headers, read_timeout=timeouts.read)


def followed_rollout(raw: Dict[str, Any]) -> Optional[FollowedRollout]:
    """A `rollout` event as the trainer takes it in (other events, progress and end, are not rollouts)."""
    if raw["event"] != "rollout":
        return None
    d = json.loads(raw["data"])
    line = BatchResult.from_json(d["line"])
    return FollowedRollout(line, Trajectory.from_json(d["trajectory"]) if d.get("trajectory") else None, line.cursor)
