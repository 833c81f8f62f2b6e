"""Hosted rollouts through both clients (`client.rollouts`), against the real stack: a busybox agent makes one model call through the gateway and runs one command in its task sandbox."""
import asyncio
import uuid

import pytest

from rollbox import FollowedRollout, NotFound
from rollbox.aio import AsyncRollbox

AGENT_CMD = " ".join([
    "wget -q -O- --header 'Content-Type: application/json' --header \"authorization: Bearer $OPENAI_API_KEY\"",
    "--post-data '{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"go\"}]}' \"$OPENAI_BASE_URL/chat/completions\"",
    "&& wget -q -O- --header 'Content-Type: application/json' --header \"authorization: Bearer $ROLLBOX_API_KEY\"",
    "--post-data \"{\\\"cmd\\\":\\\"echo tool-$AGENT_N\\\",\\\"commandId\\\":\\\"tool-$AGENT_N\\\"}\" \"$ROLLBOX_URL/v1/sandboxes/$ROLLBOX_SANDBOX_ID/exec\"",
])


def rollout_task(stack, custom_id):
    return {"customId": custom_id, "resources": {"memoryMiB": 32, "cpuMillis": 200},
            "agent": {"cmd": AGENT_CMD, "env": {"AGENT_N": custom_id}, "timeoutMs": 180_000}, "model": {"job": stack["modelJob"]}}


def check_followed(followed: FollowedRollout):
    """A rollout that ran its agent: succeeded, one model call, then its command, in its trajectory."""
    line = followed.line
    assert line.status == "succeeded", line.raw
    assert line.agent is not None and line.agent.exit_code == 0
    assert line.rollout is not None and line.rollout.model_calls == 1 and line.rollout.id.endswith(f".{line.custom_id}.1")
    assert followed.cursor == line.cursor
    trajectory = followed.trajectory
    assert trajectory is not None and trajectory.rollout_id == line.rollout.id
    assert [e.kind for e in trajectory.entries] == ["model_call", "command"]
    assert trajectory.entries[0].call["turn"] == 1
    assert trajectory.entries[1].command["argv"][-1] == f"echo tool-{line.custom_id}"


def test_follow_stopped_and_resumed_from_its_cursor_gets_each_rollout_once(client, stack):
    marker = uuid.uuid4().hex[:6]
    ids = [f"{marker}-{i}" for i in range(3)]
    batch = client.batches.submit([rollout_task(stack, i) for i in ids], max_concurrency=3)

    taken = []
    for followed in client.rollouts.follow(batch.id):  # the trainer takes one, then dies
        taken.append(followed)
        break
    taken.extend(client.rollouts.follow(batch.id, after=taken[0].cursor))  # restarted from its cursor
    assert sorted(f.line.custom_id for f in taken) == ids
    for followed in taken:
        check_followed(followed)

    rollout = client.rollouts.get(taken[-1].line.rollout.id)
    assert rollout.batch_id == batch.id and rollout.custom_id == taken[-1].line.custom_id and rollout.job == stack["modelJob"]
    assert rollout.task.state == "done" and rollout.task.status == "succeeded" and rollout.usage.model_calls == 1
    assert rollout.task_sandbox_id and rollout.agent_sandbox_id
    with pytest.raises(NotFound):
        client.rollouts.get(f"{batch.id}.nope.1")


def test_async_submit_follow_and_trajectory(stack):
    async def run():
        async with AsyncRollbox(stack["url"], stack["tokens"]["user"]) as client:
            custom_id = f"aio-{uuid.uuid4().hex[:6]}"
            batch = await client.rollouts.submit(rollout_task(stack, custom_id), metadata={"via": "aio"})
            assert batch.counts["total"] == 1 and batch.options["metadata"] == {"via": "aio"}
            followed = [f async for f in client.rollouts.follow(batch.id)]
            assert [f.line.custom_id for f in followed] == [custom_id]
            check_followed(followed[0])
            rollout_id = followed[0].line.rollout.id
            assert (await client.rollouts.trajectory(rollout_id)).raw == followed[0].trajectory.raw
            assert (await client.rollouts.get(rollout_id)).task.status == "succeeded"
            # Resumed after the last one, a follower of the ended batch has nothing left.
            assert [f async for f in client.rollouts.follow(batch.id, after=followed[0].cursor)] == []

    asyncio.run(run())


def test_submit_refuses_a_task_that_is_not_a_dict(client):
    with pytest.raises(TypeError):
        client.rollouts.submit([{"customId": "x"}])
