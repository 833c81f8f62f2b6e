"""Evaluation batches through both clients (`client.batches`), against the real stack."""
import asyncio
import base64
import os
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest

from rollbox import ConnectionFailed, InvalidRequest, RetryPolicy, Rollbox
from rollbox.aio import AsyncRollbox

from faultproxy import FaultProxy

FAST = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.05)
SMALL = {"memoryMiB": 32, "cpuMillis": 100}
COUNT_KEYS = ("total", "queued", "running", "succeeded", "failed", "timeout", "infra_error", "cancelled")


def step(cmd, timeout_ms=20_000):
    return {"cmd": cmd, "timeoutMs": timeout_ms}


def task(custom_id, cmd, timeout_ms=20_000, **more):
    return {"customId": custom_id, "resources": SMALL, "steps": [step(cmd, timeout_ms)], **more}


def mixed(i):
    """Task i: echo (succeeded), exit 3 (failed) or a sleep past its timeout (timeout), in turn."""
    kind = ("ok", "fail", "slow")[i % 3]
    if kind == "ok":
        return task(f"ok-{i}", f"echo task-{i}")
    if kind == "fail":
        return task(f"fail-{i}", "echo broken >&2; exit 3")
    return task(f"slow-{i}", "sleep 5", timeout_ms=300)


def counts(**given):
    return {k: given.get(k, 0) for k in COUNT_KEYS}


def assert_once_each(lines, n):
    """n lines, one per task, in cursor order (a stream id `ms-seq`), none repeated."""
    assert len(lines) == n
    assert len({l.custom_id for l in lines}) == n
    keys = [tuple(int(p) for p in l.cursor.split("-")) for l in lines]
    assert keys == sorted(keys) and len(set(keys)) == n


def test_json_batch_of_mixed_outcomes_followed_to_its_end(client):
    marker = uuid.uuid4().hex[:8]
    batch = client.batches.submit([mixed(i) for i in range(12)], max_concurrency=6, metadata={"suite": marker})
    assert batch.state == "in_progress" and batch.counts["total"] == 12 and not batch.done
    assert batch.options["maxConcurrency"] == 6 and batch.options["metadata"] == {"suite": marker}

    lines = list(client.batches.results(batch.id))  # long-polls until the batch ended and every line was read
    assert_once_each(lines, 12)
    by_id = {l.custom_id: l for l in lines}
    for i in range(0, 12, 3):
        ok = by_id[f"ok-{i}"]
        assert (ok.status, ok.ok, ok.attempts, ok.steps[0].exit_code, ok.steps[0].stdout) == ("succeeded", True, 1, 0, f"task-{i}\n")
        assert ok.sandbox_id and ok.grade is None and ok.error is None and ok.ended_at
        failed = by_id[f"fail-{i + 1}"]
        assert (failed.status, failed.steps[0].exit_code, failed.steps[0].stderr, failed.steps[0].ok) == ("failed", 3, "broken\n", False)
        slow = by_id[f"slow-{i + 2}"]
        assert (slow.status, slow.steps[0].exit_code, slow.steps[0].timed_out) == ("timeout", None, True)

    done = client.batches.get(batch.id)
    assert done.state == "completed" and done.done
    assert done.counts == counts(total=12, succeeded=4, failed=4, timeout=4)
    assert {"validating", "in_progress", "finalizing", "completed"} <= set(done.timestamps)
    assert done.raw["id"] == batch.id and done.created_at and done.expires_at
    assert batch.id in [b.id for b in client.batches.list()]
    # Reading again: the same lines; from a cursor on, only what came after it; no follow on an ended batch.
    assert [l.cursor for l in client.batches.results(batch.id, follow=False)] == [l.cursor for l in lines]
    assert [l.custom_id for l in client.batches.results(batch.id, after=lines[4].cursor, limit=3)] == [l.custom_id for l in lines[5:]]
    status = client.batches.task(batch.id, "fail-1")
    assert (status.state, status.status, status.attempts, status.position) == ("done", "failed", 1, None)


class Relay:
    """A TCP relay in front of the gateway that counts the request bytes it has passed on."""

    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.sent_up = 0
        self.head = b""
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                down, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection((self.upstream.hostname, self.upstream.port))
            threading.Thread(target=self._pump, args=(down, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False), daemon=True).start()

    def _pump(self, src, dst, counted):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if counted:
                    self.head = (self.head + data)[:4096]
                    self.sent_up += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.server.close()


def test_ndjson_submit_streams_a_generator(stack, client):
    pad = base64.b64encode(os.urandom(16384)).decode()  # ~22 KiB a line: 16 tasks are several 64 KiB chunks
    relay = Relay(stack["url"])
    sent_before_the_end = []

    def tasks():
        for i in range(16):
            if i == 8:
                # Half the tasks are still to come, and the first chunks are already on the wire:
                # the body is sent as the generator produces it, never built as one string first.
                deadline = time.monotonic() + 10
                while relay.sent_up < 64 * 1024 and time.monotonic() < deadline:
                    time.sleep(0.02)
                sent_before_the_end.append(relay.sent_up)
            yield task(f"t{i}", f"echo {i}; echo $SEED; wc -c < pad.bin", env={"SEED": "s"}, workdir="/work", files={"pad.bin": pad})

    marker = uuid.uuid4().hex[:8]
    try:
        with Rollbox(relay.url, stack["tokens"]["user"]) as via_relay:
            batch = via_relay.batches.submit(tasks(), max_concurrency=8, max_attempts=2, completion_window_seconds=600,
                                             sandbox_class="latency", metadata={"run": marker})
    finally:
        relay.close()
    assert sent_before_the_end[0] >= 64 * 1024 and relay.sent_up > sent_before_the_end[0]
    assert b"transfer-encoding: chunked" in relay.head.lower() and b"content-type: application/x-ndjson" in relay.head.lower()
    assert batch.state == "in_progress" and batch.counts["total"] == 16
    assert batch.options == {"maxConcurrency": 8, "maxAttempts": 2, "completionWindowSeconds": 600, "class": "latency", "metadata": {"run": marker}}
    lines = list(client.batches.results(batch.id))
    assert_once_each(lines, 16)
    assert {l.custom_id: (l.status, l.steps[0].stdout) for l in lines} == {f"t{i}": ("succeeded", f"{i}\ns\n16384\n") for i in range(16)}
    assert client.batches.get(batch.id).counts == counts(total=16, succeeded=16)


def test_ndjson_bad_line_fails_the_batch_naming_the_line(client):
    def tasks():
        yield task("a", "true")
        yield task("b", "true")
        yield {"customId": "c", "steps": []}

    with pytest.raises(InvalidRequest) as info:
        client.batches.submit(tasks())
    assert "line 3" in info.value.message
    failed_id = next(w for w in info.value.message.replace(":", " ").split() if w.startswith("batch_"))
    failed = client.batches.get(failed_id)
    assert failed.state == "failed" and failed.error["code"] == "invalid_request" and failed.counts["succeeded"] == 0
    with pytest.raises(TypeError):
        client.batches.submit({"customId": "x", "steps": [step("true")]})  # a dict is one task, not a batch


def test_task_status_then_cancel_keeps_finished_results(client):
    batch = client.batches.submit([task(f"s{i}", "sleep 1; echo done") for i in range(6)], max_concurrency=1)
    last = client.batches.task(batch.id, "s5")
    assert last.state == "queued" and last.position is not None and last.position >= 0 and last.attempts == 0
    lines, before_cancel, cancelled = [], [], None
    for line in client.batches.results(batch.id):
        lines.append(line)
        if cancelled is None:
            before_cancel = list(lines)
            cancelled = client.batches.cancel(batch.id)
            assert cancelled.state in ("cancelling", "cancelled")
    assert_once_each(lines, 6)
    assert before_cancel[0].status == "succeeded" and before_cancel[0].steps[0].stdout == "done\n"
    assert [(l.custom_id, l.status) for l in lines[: len(before_cancel)]] == [(l.custom_id, l.status) for l in before_cancel]  # kept
    assert {l.status for l in lines} <= {"succeeded", "cancelled"}
    stopped = [l for l in lines if l.status == "cancelled"]
    assert stopped and all(l.error["code"] == "cancelled" for l in stopped)
    end = client.batches.get(batch.id)
    assert end.state == "cancelled" and end.done and "cancelling" in end.timestamps
    assert end.counts == counts(total=6, succeeded=6 - len(stopped), cancelled=len(stopped))
    assert client.batches.task(batch.id, before_cancel[0].custom_id).status == "succeeded"
    gone = client.batches.task(batch.id, stopped[-1].custom_id)
    assert (gone.state, gone.status) == ("done", "cancelled")
    assert client.batches.cancel(batch.id).state == "cancelled"  # again: nothing changes


def test_async_twin_submits_and_follows(stack):
    async def main():
        async with AsyncRollbox(stack["url"], stack["tokens"]["user"]) as client:
            async def produced():
                for i in range(5):
                    await asyncio.sleep(0)
                    yield task(f"a{i}", f"echo a{i}")

            json_batch = await client.batches.submit([mixed(i) for i in range(6)], max_concurrency=6)
            ndjson_batch = await client.batches.submit(produced(), max_concurrency=5, metadata={"via": "async"})
            assert (ndjson_batch.counts["total"], ndjson_batch.options["metadata"]) == (5, {"via": "async"})

            async def follow(batch_id):
                return [line async for line in client.batches.results(batch_id)]

            json_lines, ndjson_lines = await asyncio.gather(follow(json_batch.id), follow(ndjson_batch.id))
            assert_once_each(json_lines, 6)
            assert sorted(l.status for l in json_lines) == ["failed", "failed", "succeeded", "succeeded", "timeout", "timeout"]
            assert {l.custom_id: l.steps[0].stdout for l in ndjson_lines} == {f"a{i}": f"a{i}\n" for i in range(5)}
            assert (await client.batches.get(json_batch.id)).counts == counts(total=6, succeeded=2, failed=2, timeout=2)
            assert (await client.batches.task(ndjson_batch.id, "a3")).status == "succeeded"
            assert {json_batch.id, ndjson_batch.id} <= {b.id for b in await client.batches.list()}
            assert (await client.batches.cancel(ndjson_batch.id)).state == "completed"  # ended already: nothing to cancel

    asyncio.run(main())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_dropped_results_answers_are_read_again_from_the_last_cursor(stack, client, flavour):
    batch = client.batches.submit([task(f"d{i}", f"sleep 0.3; echo {i}") for i in range(8)], max_concurrency=2)
    path = f"/v1/batches/{batch.id}/results"
    # The first answer (a long-poll that returned with lines) and a later one are read by the proxy, then dropped.
    plan = lambda m, p, n: "served_then_drop" if (m, p) == ("GET", path) and n in (1, 3) else "forward"
    with FaultProxy(stack["url"], plan) as proxy:
        if flavour == "sync":
            with Rollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as via_proxy:
                lines = list(via_proxy.batches.results(batch.id))
        else:
            async def follow():
                async with AsyncRollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as via_proxy:
                    return [line async for line in via_proxy.batches.results(batch.id)]

            lines = asyncio.run(follow())
        assert proxy.seen[("GET", path)] >= 4
    assert_once_each(lines, 8)
    assert {l.custom_id: l.steps[0].stdout for l in lines} == {f"d{i}": f"{i}\n" for i in range(8)}
    assert [l.cursor for l in client.batches.results(batch.id)] == [l.cursor for l in lines]


def test_submit_is_retried_only_when_it_certainly_did_not_arrive(stack, client):
    marker = uuid.uuid4().hex[:8]
    mine = lambda: [b for b in client.batches.list() if b.options.get("metadata") == {"run": marker}]
    # A 503 (not served): sent again, one batch.
    plan = lambda m, p, n: "unavailable" if (m, p, n) == ("POST", "/v1/batches", 1) else "forward"
    with FaultProxy(stack["url"], plan) as proxy, Rollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as via_proxy:
        batch = via_proxy.batches.submit([task("x", "true")], metadata={"run": marker})
        assert proxy.seen[("POST", "/v1/batches")] == 2
    assert [b.id for b in mine()] == [batch.id]
    # Served, then the answer lost: it may have arrived, and a batch has no idempotency key: not sent again.
    plan = lambda m, p, n: "served_then_drop" if (m, p) == ("POST", "/v1/batches") else "forward"
    with FaultProxy(stack["url"], plan) as proxy, Rollbox(proxy.url, stack["tokens"]["user"], retry=FAST) as via_proxy:
        with pytest.raises(ConnectionFailed):
            via_proxy.batches.submit([task("y", "true")], metadata={"run": marker})
        assert proxy.seen[("POST", "/v1/batches")] == 1
    assert len(mine()) == 2


def test_a_streamed_submit_is_sent_once_at_most():
    from rollbox import _batch_core as bcore
    from rollbox import _core as core
    from rollbox.errors import Unavailable

    request = bcore.submit_request((task(f"g{i}", "true") for i in range(3)), {"maxConcurrency": 2})
    assert request.stream is not None and not request.replayable and request.path == "/v1/batches?maxConcurrency=2"
    assert core.should_retry(ConnectionFailed("refused", maybe_sent=False), request)  # nothing pulled yet: safe
    body = b"".join(request.stream.chunks())
    assert body.count(b"\n") == 3 and request.stream.count == 3
    # Its tasks are consumed: whatever the failure, it cannot be sent again as it was.
    assert not core.should_retry(ConnectionFailed("refused", maybe_sent=False), request)
    assert not core.should_retry(Unavailable("busy", status=503), request)
    with pytest.raises(RuntimeError):
        next(request.stream.chunks())
