"""Hosted rollouts for the asyncio client (`client.rollouts`): `rollbox.rollouts`' names and semantics, awaited."""
from __future__ import annotations

from typing import Any, AsyncIterator, Mapping, Optional

from . import _batch_core as bcore
from . import _core as core
from .types import Batch, FollowedRollout, Rollout, Trajectory


class AsyncRollouts:
    def __init__(self, client: Any):
        self._client = client

    async def submit(self, task: Mapping[str, Any], *, max_attempts: Optional[int] = None, completion_window_seconds: Optional[int] = None,
                     sandbox_class: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> Batch:
        """One rollout: the answer is its batch of one task. Never sent twice."""
        options = bcore.batch_options(max_concurrency=None, max_attempts=max_attempts, completion_window_seconds=completion_window_seconds,
                                      sandbox_class=sandbox_class, metadata=metadata)
        return Batch.from_json(await self._client._call(bcore.rollout_submit_request(task, options)))

    async def get(self, rollout_id: str) -> Rollout:
        return Rollout.from_json(await self._client._call(core.Request("GET", bcore.rollout_path(rollout_id))))

    async def trajectory(self, rollout_id: str) -> Trajectory:
        return Trajectory.from_json(await self._client._call(core.Request("GET", bcore.rollout_path(rollout_id, "/trajectory"))))

    async def follow(self, batch_id: str, *, after: Optional[str] = None) -> AsyncIterator[FollowedRollout]:
        """As `Rollouts.follow`: each finished task with its trajectory, pushed by the gateway, resumed after the cursor `after`."""
        async for followed in self._client._events(lambda last: bcore.rollout_events_request(batch_id, last, self._client.timeouts), after or "",
                                                   bcore.followed_rollout, "end"):
            yield followed
