"""Handles cross process boundaries (Ray, multiprocessing): they pickle to base URL, token and id."""
import multiprocessing
import os
import pickle

from rollbox import ExecResult, Rollbox
from rollbox.aio import AsyncRollbox, AsyncSandbox


def exec_in_child(sandbox, queue):
    queue.put((os.getpid(), sandbox.exec("cat /tmp/from-parent; echo child >> /tmp/from-parent")))


def test_a_pickled_sandbox_is_used_from_another_process(client, sandbox):
    sandbox.exec("echo parent > /tmp/from-parent")
    state = pickle.loads(pickle.dumps(sandbox)).__reduce__()[1][0]
    assert set(state) == {"base_url", "token", "timeouts", "retry", "max_connections"}  # no socket, no lock
    for method in ("spawn", "fork"):
        ctx = multiprocessing.get_context(method)
        queue = ctx.Queue()
        child = ctx.Process(target=exec_in_child, args=(sandbox, queue))
        child.start()
        pid, result = queue.get(timeout=60)
        child.join(60)
        assert child.exitcode == 0 and pid != os.getpid()
        assert isinstance(result, ExecResult) and result.exit_code == 0
    assert sandbox.exec("cat /tmp/from-parent").stdout == "parent\nchild\nchild\n"
    # The parent's pooled connections were never used by the forked child.
    assert sandbox.exec("true").exit_code == 0


def test_clients_and_async_handles_pickle_too(stack):
    client = pickle.loads(pickle.dumps(Rollbox(stack["url"], stack["tokens"]["user"])))
    assert client.base_url == stack["url"] and client._transport is None
    handle = pickle.loads(pickle.dumps(AsyncRollbox(stack["url"], stack["tokens"]["user"]).sandbox("sbx_x")))
    assert isinstance(handle, AsyncSandbox) and handle.id == "sbx_x" and handle._client.token == stack["tokens"]["user"]
