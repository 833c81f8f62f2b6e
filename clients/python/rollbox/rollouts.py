"""Hosted rollouts for the synchronous client (`client.rollouts`); `rollbox.aio_rollouts` is the async twin."""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional

from . import _batch_core as bcore
from . import _core as core
from .types import Batch, FollowedRollout, Rollout, Trajectory


class Rollouts:
    """
    The trainer's side of hosted rollouts (scope `rollout:submit`): a task with an `agent` and
    a `model` (`{"job": ...}`) runs its agent in its own sandbox beside the task sandbox, its
    model calls recorded by the gateway. A rollout is a batch task: submit one here (a batch of
    one) or many with `client.batches.submit`, follow either with `follow`, cancel with
    `client.batches.cancel`.
    """

    def __init__(self, client: Any):
        self._client = client

    def submit(self, task: Mapping[str, Any], *, max_attempts: Optional[int] = None, completion_window_seconds: Optional[int] = None,
               sandbox_class: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> Batch:
        """One rollout: the answer is its batch of one task. Never sent twice (no idempotency key)."""
        options = bcore.batch_options(max_concurrency=None, max_attempts=max_attempts, completion_window_seconds=completion_window_seconds,
                                      sandbox_class=sandbox_class, metadata=metadata)
        return Batch.from_json(self._client._call(bcore.rollout_submit_request(task, options)))

    def get(self, rollout_id: str) -> Rollout:
        """Where the attempt ran, its task's state in its batch, its model usage so far."""
        return Rollout.from_json(self._client._call(core.Request("GET", bcore.rollout_path(rollout_id))))

    def trajectory(self, rollout_id: str) -> Trajectory:
        """Its model calls and task-sandbox commands, in the order they began (whole once it has finished)."""
        return Trajectory.from_json(self._client._call(core.Request("GET", bcore.rollout_path(rollout_id, "/trajectory"))))

    def follow(self, batch_id: str, *, after: Optional[str] = None, wait_seconds: float = bcore.RESULTS_WAIT_S) -> Iterator[FollowedRollout]:
        """
        The batch's finished tasks in the order they ended, each with its rollout's trajectory,
        until the batch has ended and every line was read. Keep the `cursor` of the last one
        taken and pass it as `after` after a restart: each rollout is delivered once. One is
        handed out only after its trajectory was read.
        """
        for line in self._client.batches.results(batch_id, after=after, follow=True, wait_seconds=wait_seconds):
            trajectory = self.trajectory(line.rollout.id) if line.rollout else None
            yield FollowedRollout(line, trajectory, line.cursor)
