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

    def follow(self, batch_id: str, *, after: Optional[str] = None) -> Iterator[FollowedRollout]:
        """
        The batch's finished tasks in the order they ended, each with its rollout's trajectory,
        pushed by the gateway (server-sent events) until the batch has ended. Keep the `cursor`
        of the last one taken and pass it as `after` after a restart: each rollout is delivered
        once. A dropped stream is resumed from the last cursor after a backoff (a stream cut
        `RetryPolicy.attempts` times in a row with no rollout between raises ConnectionFailed);
        an unknown batch raises NotFound, a token without the scope Forbidden.
        """
        return self._client._events(lambda last: bcore.rollout_events_request(batch_id, last, self._client.timeouts), after or "",
                                    bcore.followed_rollout, "end")
