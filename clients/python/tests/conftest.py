"""
The tests run against a real stack: the test session starts one (test/support/python-stack.ts,
the cluster the TypeScript integration tests use: its own redis-server, a gateway, a worker
host with real runc sandboxes) unless ROLLBOX_TEST_STACK names one as JSON.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "clients" / "python"))


@pytest.fixture(scope="session")
def stack():
    given = os.environ.get("ROLLBOX_TEST_STACK")
    if given:
        yield json.loads(given)
        return
    tsx = REPO / "node_modules" / ".bin" / "tsx"
    proc = subprocess.Popen([str(tsx), "test/support/python-stack.ts"], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the stack did not start (exit {proc.wait()})")
        yield json.loads(line)
    finally:
        proc.stdin.close()  # the stack stops itself when its stdin closes
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


@pytest.fixture
def client(stack):
    from rollbox import Rollbox

    with Rollbox(stack["url"], stack["tokens"]["user"]) as c:
        yield c


@pytest.fixture
def sandbox(client):
    sb = client.sandboxes.create(resources={"memoryMiB": 128, "cpuMillis": 500}, labels={"suite": "python"})
    yield sb
    sb.delete()
