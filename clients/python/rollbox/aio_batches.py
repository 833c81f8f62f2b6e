"""Evaluation batches for the asyncio client (`client.batches`): `rollbox.batches`' names and semantics, awaited."""
from __future__ import annotations

from typing import Any, AsyncIterable, AsyncIterator, Iterable, List, Mapping, Optional, Union
from urllib.parse import quote

from . import _batch_core as bcore
from . import _core as core
from .types import Batch, BatchResult, BatchTaskStatus



class AsyncBatches:
    def __init__(self, client: core.AsyncCaller):
        self._client = client

    async def submit(self, tasks: Union[List[Mapping[str, Any]], Iterable[Mapping[str, Any]], AsyncIterable[Mapping[str, Any]]], *,
                     max_concurrency: Optional[int] = None, max_attempts: Optional[int] = None, completion_window_seconds: Optional[int] = None,
                     sandbox_class: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> Batch:
        """A list goes as JSON; any other iterable, sync or async, as NDJSON streamed as it is produced. Never sent twice."""
        options = bcore.batch_options(max_concurrency=max_concurrency, max_attempts=max_attempts,
                                     completion_window_seconds=completion_window_seconds, sandbox_class=sandbox_class, metadata=metadata)
        return Batch.from_json(await self._client._call(bcore.submit_request(tasks, options)))

    async def get(self, batch_id: str) -> Batch:
        return Batch.from_json(await self._client._call(core.Request("GET", bcore.batch_path(batch_id))))

    async def list(self, limit: int = 100) -> List[Batch]:
        answer = await self._client._call(core.Request("GET", f"/v1/batches?limit={int(limit)}"))
        return [Batch.from_json(b) for b in answer["batches"]]

    async def cancel(self, batch_id: str) -> Batch:
        return Batch.from_json(await self._client._call(core.Request("POST", bcore.batch_path(batch_id, "/cancel"))))

    async def task(self, batch_id: str, custom_id: str) -> BatchTaskStatus:
        path = bcore.batch_path(batch_id, f"/tasks/{quote(custom_id, safe='')}")
        return BatchTaskStatus.from_json(await self._client._call(core.Request("GET", path)))

    async def results(self, batch_id: str, *, after: Optional[str] = None, follow: bool = True, wait_seconds: float = bcore.RESULTS_WAIT_S,
                      limit: int = 1000) -> AsyncIterator[BatchResult]:
        """Result lines as `Batches.results`: followed with long-polls until the batch ended, resumed from the last cursor."""
        follower = bcore.ResultsFollower(batch_id, after=after, follow=follow, wait_seconds=wait_seconds, limit=limit, timeouts=self._client.timeouts)
        while True:
            request = follower.request()
            if request is None:
                return
            for line in follower.take(await self._client._call(request)):
                yield line
