"""Retries, resumed streams, keep-alive and descriptors: failures injected by a proxy in front of the real stack."""
import asyncio
import os
import socket
import time
import uuid

import pytest

import rollbox
from rollbox import ConnectionFailed, RetryPolicy, Rollbox, Timeouts
from rollbox.aio import AsyncRollbox

from faultproxy import FaultProxy

FAST = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.05)


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_503_after_the_create_was_served_retries_with_the_same_key_and_makes_one_sandbox(stack):
    label = uuid.uuid4().hex[:12]
    plan = lambda m, p, n: "served_then_unavailable" if (m, p, n) == ("POST", "/v1/sandboxes", 1) else "forward"
    with FaultProxy(stack["url"], plan) as proxy, Rollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as client:
        sb = client.sandboxes.create(labels={"once": label})
        try:
            assert proxy.seen[("POST", "/v1/sandboxes")] == 2
            assert [s.id for s in client.sandboxes.list(label=f"once={label}")] == [sb.id]
        finally:
            sb.delete()


def test_503_is_waited_out_honouring_retry_after(stack, sandbox):
    plan = lambda m, p, n: "unavailable" if p.endswith("/exec") and n <= 2 else "forward"
    with FaultProxy(stack["url"], plan, retry_after="1") as proxy, Rollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as client:
        started = time.monotonic()
        assert client.sandbox(sandbox.id).exec("echo ok").stdout == "ok\n"
        assert time.monotonic() - started >= 2.0  # two Retry-After: 1 waits, not FAST's backoff
        assert proxy.seen[("POST", f"/v1/sandboxes/{sandbox.id}/exec")] == 3


def test_a_dropped_answer_is_retried_with_the_same_command_id_and_runs_once(stack, sandbox):
    plan = lambda m, p, n: "served_then_drop" if p.endswith("/exec") and n == 1 else "forward"
    with FaultProxy(stack["url"], plan) as proxy, Rollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as client:
        r = client.sandbox(sandbox.id).exec("echo x >> /tmp/runs; wc -l < /tmp/runs")
        assert (r.stdout, r.replayed) == ("1\n", True)
        assert proxy.seen[("POST", f"/v1/sandboxes/{sandbox.id}/exec")] == 2
    assert sandbox.exec("wc -l < /tmp/runs").stdout == "1\n"


def test_never_retried_a_non_zero_exit_or_a_run_that_may_have_arrived(stack, sandbox):
    with FaultProxy(stack["url"]) as proxy, Rollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as client:
        assert client.sandbox(sandbox.id).exec("exit 1").exit_code == 1
        assert proxy.seen[("POST", f"/v1/sandboxes/{sandbox.id}/exec")] == 1
    plan = lambda m, p, n: "served_then_drop" if p == "/v1/run" else "forward"
    with FaultProxy(stack["url"], plan) as proxy, Rollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as client:
        with pytest.raises(ConnectionFailed):
            client.run("true")
        assert proxy.seen[("POST", "/v1/run")] == 1


def test_connection_refused_is_retried_then_reported(stack):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again at once: nothing listens there
    client = Rollbox(f"http://127.0.0.1:{port}", "t", retry=FAST)
    with pytest.raises(ConnectionFailed) as info:
        client.sandboxes.list()
    assert not info.value.maybe_sent


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_dropped_stream_resumes_without_losing_or_repeating_output(stack, sandbox, flavour):
    cmd = "echo x >> /tmp/streams; for i in 1 2 3 4 5 6; do echo line$i; sleep 0.1; done"
    plan = lambda m, p, n: ("cut_after_events", 2) if p.endswith("/exec") and n == 1 else "forward"
    with FaultProxy(stack["url"], plan) as proxy:
        if flavour == "sync":
            events = list(Rollbox(proxy.url, stack["tokens"]["user"], retry=FAST).sandbox(sandbox.id).stream(cmd))
        else:
            async def follow():
                async with AsyncRollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as client:
                    return [e async for e in client.sandbox(sandbox.id).stream(cmd)]

            events = asyncio.run(follow())
        assert proxy.seen[("POST", f"/v1/sandboxes/{sandbox.id}/exec")] >= 2
    assert "".join(e.data for e in events if e.type == "stdout") == "".join(f"line{i}\n" for i in range(1, 7))
    assert events[-1].type == "exit" and events[-1].result.exit_code == 0
    assert sandbox.exec("wc -l < /tmp/streams").stdout == "1\n"


def test_idle_connections_are_dropped_before_the_gateway_closes_them(stack, sandbox):
    with Rollbox(stack["url"], stack["tokens"]["user"], retry=RetryPolicy(attempts=1)) as client:
        sb = client.sandbox(sandbox.id)
        sb.refresh()
        sb.refresh()
        assert client.transport.opened == 1  # reused
        time.sleep(5.5)  # past the gateway's 5 s keep-alive: its side of the connection is gone
        sb.refresh()  # no retry allowed: a stale connection would fail this call
        assert client.transport.opened == 2


def test_no_descriptor_leak_over_2000_calls(stack, sandbox):
    with Rollbox(stack["url"], stack["tokens"]["user"], max_connections=4) as client:
        sb = client.sandbox(sandbox.id)
        sb.refresh()
        before = fds()
        for _ in range(2_000):
            sb.refresh()
        assert fds() - before <= 4 and client.transport.opened <= 4

    async def many():
        async with AsyncRollbox(stack["url"], stack["tokens"]["user"], max_connections=16) as client:
            sb = client.sandbox(sandbox.id)
            await sb.refresh()
            start = fds()
            sem = asyncio.Semaphore(32)

            async def one():
                async with sem:
                    await sb.refresh()

            await asyncio.gather(*(one() for _ in range(2_000)))
            return fds() - start

    assert asyncio.run(many()) <= 16
