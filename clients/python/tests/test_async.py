"""The asyncio client: the same names and semantics, against the same real stack."""
import asyncio
import os
import uuid

import pytest

import rollbox
from rollbox.aio import AsyncRollbox


def run(coro):
    return asyncio.run(coro)


def test_async_client_covers_the_same_surface(stack, tmp_path):
    async def main():
        async with AsyncRollbox(stack["url"], stack["tokens"]["user"]) as client:
            job = f"job-{uuid.uuid4().hex[:8]}"
            key = f"py-{uuid.uuid4().hex}"
            sb = await client.sandboxes.create(env={"A": "1"}, labels={"t": "a"}, job=job, hidden_paths=[], idempotency_key=key)
            assert (await client.sandboxes.create(env={"A": "1"}, labels={"t": "a"}, job=job, hidden_paths=[], idempotency_key=key)).id == sb.id
            async with sb:
                r = await sb.exec(["/bin/sh", "-c", "cat; echo $A$B"], stdin="in\n", env={"B": "2"}, cwd="/tmp", command_id="a-1")
                assert (r.exit_code, r.stdout, r.replayed) == (0, "in\n12\n", False)
                assert (await sb.exec("echo other", command_id="a-1")).replayed
                assert (await sb.exec("sleep 5", timeout=0.3)).timed_out
                with pytest.raises(rollbox.CommandFailed):
                    await sb.exec("exit 7", check=True)
                events = [e async for e in sb.stream("echo a; echo b >&2; exit 1")]
                assert [e.type for e in events][-1] == "exit" and events[-1].result.exit_code == 1
                assert "".join(e.data for e in events if e.type == "stdout") == "a\n"
                await sb.exec_background("sleep 0.3; echo bg", command_id="a-bg")
                followed = [e async for e in sb.stream("x", command_id="a-bg")]
                assert followed[-1].result.exit_code == 0 and (await sb.command("a-bg")).stdout == "bg\n"
                await sb.pty("read line; echo \"got $line\"; stty size", cols=20, rows=5, command_id="a-pty")
                await sb.resize("a-pty", 30, 6)
                await sb.write_stdin("a-pty", "key\n")
                on_tty = [e async for e in sb.follow("a-pty")]
                assert "".join(e.data for e in on_tty if e.type == "pty") == "key\r\ngot key\r\n6 30\r\n"
                assert len(await sb.commands()) >= 4
                assert (await sb.metrics())["memUsed"] > 0
                paged = [c["commandId"] async for c in sb.iter_commands(page_size=2)]
                assert paged == [c["commandId"] for c in await sb.commands()] and len(paged) >= 4
                assert (await sb.command_page(limit=2))["nextCursor"]
                await sb.files.write("/work/f", b"bytes", mode="0600")
                assert await sb.files.read("/work/f") == b"bytes"
                (tmp_path / "d").mkdir()
                (tmp_path / "d" / "x").write_text("x\n")
                await sb.files.upload(str(tmp_path / "d"), "/work/d")
                await sb.exec("echo y > /work/d/y")
                await sb.files.download("/work/d", str(tmp_path / "back"))
                assert sorted(os.listdir(tmp_path / "back")) == ["x", "y"]
                assert (await sb.pause()).state == "paused"
                assert (await sb.resume()).state == "running"
                await sb.set_policy(hidden_paths=["/work"])
                assert (await sb.exec("cat /work/f")).exit_code != 0
                await sb.exec("echo f > /root/forked")
                forked = await sb.fork(1, ttl_seconds=120)
                assert forked["created"] == 1 and forked["parent"] == sb.id
                async with client.sandbox(forked["children"][0]["id"]) as child:
                    assert (await child.exec("cat /root/forked")).stdout == "f\n"
                    assert (await child.refresh()).record["lineage"]["parent"] == sb.id
                layer = await sb.snapshot(name=f"py-async-{uuid.uuid4().hex[:8]}")
                from_snap = await client.sandboxes.fork_snapshot(layer["digest"], 1)
                async with client.sandbox(from_snap["children"][0]["id"]) as child:
                    assert (await child.exec("cat /root/forked")).stdout == "f\n"
                assert (await client.layers.get(layer["digest"]))["digest"] == layer["digest"]
                assert any(l["digest"] == layer["digest"] for l in await client.layers.list())
                assert [s.id for s in await client.sandboxes.list(job=job, state="running")] == [sb.id]  # its (ended) fork children carry the job too
                assert (await client.jobs.pause(job))["results"][0]["outcome"] == "done"
                assert (await client.jobs.resume(job))["results"][0]["outcome"] == "done"
                assert (await (await client.sandboxes.get(sb.id)).refresh()).state == "running"
            assert sb.state == "terminated"
            ran = await client.run("cat in; echo o > out", files={"in": b"i\n"}, fetch=["out"])
            assert (ran.status, ran.stdout, ran.files) == ("ok", "i\n", {"out": b"o\n"})
            with pytest.raises(rollbox.NotFound):
                await client.sandbox("sbx_nope").exec("true")

    run(main())


def test_async_concurrent_rollouts_share_a_bounded_pool(stack):
    async def main():
        async with AsyncRollbox(stack["url"], stack["tokens"]["user"], max_connections=8) as client:
            sbs = await asyncio.gather(*(client.sandboxes.create() for _ in range(4)))
            try:
                async def rollout(sb):
                    for turn in range(5):
                        r = await sb.exec(f"echo {turn}", command_id=f"t{turn}")
                        assert r.stdout == f"{turn}\n"

                await asyncio.gather(*(rollout(sb) for sb in sbs))
            finally:
                await asyncio.gather(*(sb.delete() for sb in sbs))

    run(main())
