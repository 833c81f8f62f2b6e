"""
`rollbox` (the Python client) following a batch's rollouts for test/rollout-follow.test.ts:
python3 python-rollout-follow.py URL TOKEN BATCH sync|async [ATTEMPTS]. Prints one JSON line
per rollout taken ({customId, cursor, rolloutId, trajectoryOf, kinds}), then {"end": true}, or
{"error": class name, "code": ...} when the follow raised.
"""
import asyncio
import json
import sys

from rollbox import RetryPolicy, Rollbox, RollboxError
from rollbox.aio import AsyncRollbox

url, token, batch_id, mode = sys.argv[1:5]
retry = RetryPolicy(attempts=int(sys.argv[5])) if len(sys.argv) > 5 else None


def emit(followed):
    line, trajectory = followed.line, followed.trajectory
    print(json.dumps({"customId": line.custom_id, "cursor": followed.cursor, "rolloutId": line.rollout.id if line.rollout else None,
                      "trajectoryOf": trajectory.rollout_id if trajectory else None, "kinds": [e.kind for e in trajectory.entries] if trajectory else []}), flush=True)


async def follow_async():
    async with AsyncRollbox(url, token, retry=retry) as client:
        async for followed in client.rollouts.follow(batch_id):
            emit(followed)


try:
    if mode == "async":
        asyncio.run(follow_async())
    else:
        with Rollbox(url, token, retry=retry) as client:
            for followed in client.rollouts.follow(batch_id):
                emit(followed)
    print(json.dumps({"end": True}), flush=True)
except RollboxError as error:
    print(json.dumps({"error": type(error).__name__, "code": error.code}), flush=True)
