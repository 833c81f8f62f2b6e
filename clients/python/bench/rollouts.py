"""
64 concurrent rollouts x 20 turns through the async client, beside the same load through
plain httpx from the same process (same sandboxes, same commands; rounds alternate so both
see the same host). Progress on stderr; writes the latency samples to the file named by
BENCH_SAMPLES_FILE; one JSON line last on stdout. Run by `npm run bench:python-client`.
"""
import asyncio
import json
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import httpx  # noqa: E402

from rollbox.aio import AsyncRollbox  # noqa: E402

URL, TOKEN = os.environ["ROLLBOX_URL"], os.environ["ROLLBOX_TOKEN"]
ROLLOUTS = int(os.environ.get("BENCH_ROLLOUTS", 64))
TURNS = int(os.environ.get("BENCH_TURNS", 20))
ROUNDS = 4  # client, plain, client, plain: TURNS/2 turns each per rollout


def pct(samples, p):
    s = sorted(samples)
    return round(s[min(len(s) - 1, int(len(s) * p / 100))], 2)


async def main():
    client = AsyncRollbox(URL, TOKEN, max_connections=ROLLOUTS)
    plain = httpx.AsyncClient(base_url=URL, headers={"authorization": f"Bearer {TOKEN}"},
                              limits=httpx.Limits(max_connections=ROLLOUTS, keepalive_expiry=4), timeout=120)
    sandboxes = await asyncio.gather(*(client.sandboxes.create(resources={"memoryMiB": 64, "cpuMillis": 100}) for _ in range(ROLLOUTS)))
    samples = {"client": [], "plain": []}
    cpu = {"client": 0.0, "plain": 0.0}
    done, total = 0, ROLLOUTS * TURNS

    async def via_client(sb, turn):
        r = await sb.exec(f"echo {turn} >> /tmp/turns; tail -n 1 /tmp/turns", command_id=f"t{turn}")
        assert r.stdout == f"{turn}\n", r

    async def via_plain(sb, turn):
        body = {"cmd": f"echo {turn} >> /tmp/turns; tail -n 1 /tmp/turns", "commandId": f"t{turn}"}
        r = await plain.post(f"/v1/sandboxes/{sb.id}/exec", json=body)
        r.raise_for_status()
        assert r.json()["stdout"] == f"{turn}\n"

    turn = 0
    for rnd in range(ROUNDS):
        kind = "client" if rnd % 2 == 0 else "plain"
        do = via_client if kind == "client" else via_plain
        first_turn = turn

        async def rollout(sb):
            nonlocal done
            for t in range(first_turn, first_turn + TURNS // ROUNDS):
                started = time.perf_counter()
                await do(sb, t)
                samples[kind].append((time.perf_counter() - started) * 1000)
                done += 1
                if done % 64 == 0:
                    print(f"\r[{done}/{total}] turns ({kind} round {rnd + 1}/{ROUNDS})", end="", file=sys.stderr, flush=True)

        cpu_start = time.process_time()
        await asyncio.gather(*(rollout(sb) for sb in sandboxes))
        cpu[kind] += time.process_time() - cpu_start
        turn += TURNS // ROUNDS
    print("", file=sys.stderr)
    await asyncio.gather(*(sb.delete() for sb in sandboxes))
    await plain.aclose()
    await client.close()
    with open(os.environ.get("BENCH_SAMPLES_FILE", os.devnull), "w") as f:
        json.dump(samples, f)
    calls = {k: len(v) for k, v in samples.items()}
    print(json.dumps({
        "bench": "python-client",
        "rollouts": ROLLOUTS,
        "turns": TURNS,
        "client": {"p50Ms": pct(samples["client"], 50), "p99Ms": pct(samples["client"], 99), "calls": calls["client"]},
        "plainHttpx": {"p50Ms": pct(samples["plain"], 50), "p99Ms": pct(samples["plain"], 99), "calls": calls["plain"]},
        "clientOverheadP50Ms": round(pct(samples["client"], 50) - pct(samples["plain"], 50), 2),
        # CPU of this Python process per call: what the client costs a trainer, apart from the wait.
        "cpuPerCallMs": {"client": round(cpu["client"] * 1000 / calls["client"], 3), "plainHttpx": round(cpu["plain"] * 1000 / calls["plain"], 3)},
        "clientCpuOverheadPerCallMs": round((cpu["client"] / calls["client"] - cpu["plain"] / calls["plain"]) * 1000, 3),
        "meanMs": {"client": round(statistics.mean(samples["client"]), 2), "plainHttpx": round(statistics.mean(samples["plain"]), 2)},
    }))


asyncio.run(main())
