"""Evaluation batches for the synchronous client (`client.batches`); `rollbox.aio_batches` is the async twin."""
from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Mapping, Optional, Union
from urllib.parse import quote

from . import _batch_core as bcore
from . import _core as core
from .types import Batch, BatchResult, BatchTaskStatus



class Batches:
    """
    Tasks run by the platform (scope `batch:submit`): each in its own sandbox, steps then an
    optional grade, results read back as they end. Task dicts are the API's
    (`{"customId", "steps": [{"cmd"|"argv", "timeoutMs", ...}], "image", "files", "grade", ...}`).
    """

    def __init__(self, client: core.Caller):
        self._client = client

    def submit(self, tasks: Union[List[Mapping[str, Any]], Iterable[Mapping[str, Any]]], *, max_concurrency: Optional[int] = None,
               max_attempts: Optional[int] = None, completion_window_seconds: Optional[int] = None, sandbox_class: Optional[str] = None,
               metadata: Optional[Mapping[str, str]] = None) -> Batch:
        """
        A new batch, `in_progress` (its tasks queued). A list is sent as one JSON body; any
        other iterable (a generator) as NDJSON, streamed chunk by chunk as it is produced, so
        50,000 tasks are never held at once; a bad line fails the batch (InvalidRequest naming
        the line). Never sent twice: a submit that may have arrived is not retried.
        """
        options = bcore.batch_options(max_concurrency=max_concurrency, max_attempts=max_attempts,
                                     completion_window_seconds=completion_window_seconds, sandbox_class=sandbox_class, metadata=metadata)
        return Batch.from_json(self._client._call(bcore.submit_request(tasks, options)))

    def get(self, batch_id: str) -> Batch:
        return Batch.from_json(self._client._call(core.Request("GET", bcore.batch_path(batch_id))))

    def list(self, limit: int = 100) -> List[Batch]:
        """The tenant's batches, newest first."""
        answer = self._client._call(core.Request("GET", f"/v1/batches?limit={int(limit)}"))
        return [Batch.from_json(b) for b in answer["batches"]]

    def cancel(self, batch_id: str) -> Batch:
        """Queued tasks end `cancelled` at once, running ones soon after; results already written stay."""
        return Batch.from_json(self._client._call(core.Request("POST", bcore.batch_path(batch_id, "/cancel"))))

    def task(self, batch_id: str, custom_id: str) -> BatchTaskStatus:
        """One task: queued (with its position), running, or done (with its status)."""
        path = bcore.batch_path(batch_id, f"/tasks/{quote(custom_id, safe='')}")
        return BatchTaskStatus.from_json(self._client._call(core.Request("GET", path)))

    def results(self, batch_id: str, *, after: Optional[str] = None, follow: bool = True, wait_seconds: float = bcore.RESULTS_WAIT_S,
                limit: int = 1000) -> Iterator[BatchResult]:
        """
        Result lines, oldest first, from after the cursor `after` (a line's `.cursor`). With
        `follow` (the default) it long-polls a running batch until the batch has ended and
        every line was read; without, it stops at the last line written so far. A dropped
        connection is retried from the last line handed out: none is lost or repeated.
        """
        follower = bcore.ResultsFollower(batch_id, after=after, follow=follow, wait_seconds=wait_seconds, limit=limit, timeouts=self._client.timeouts)
        while True:
            request = follower.request()
            if request is None:
                return
            for line in follower.take(self._client._call(request)):
                yield line
