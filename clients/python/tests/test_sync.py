"""Every method of the synchronous client against a real stack."""
import io
import os
import tarfile
import time
import uuid

import pytest

import rollbox
from rollbox import CommandFailed, InvalidRequest, NotFound, Rollbox, RollboxError


def test_create_binds_everything_and_delete_ends_it(client):
    job = f"job-{uuid.uuid4().hex[:8]}"
    with client.sandboxes.create(
        image="busybox", resources={"memoryMiB": 128, "cpuMillis": 500}, network={"mode": "none"},
        hidden_paths=["/srv/answers"], env={"TASK": "t17"}, labels={"task": "t17"}, job=job, workdir="/root",
    ) as sb:
        assert sb.state == "running" and sb.record["spec"]["labels"] == {"task": "t17"} and sb.record["spec"]["job"] == job
        r = sb.exec("echo $TASK; pwd")
        assert (r.exit_code, r.stdout) == (0, "t17\n/root\n")
        assert [s.id for s in client.sandboxes.list(job=job)] == [sb.id]
        assert client.sandboxes.get(sb.id).record["state"] == "running"
    assert sb.record["state"] == "terminated"
    assert sb.refresh().state == "terminated"


def test_idempotency_key_gives_the_same_sandbox(client):
    key = f"py-{uuid.uuid4().hex}"
    a = client.sandboxes.create(idempotency_key=key, labels={"k": "1"})
    b = client.sandboxes.create(idempotency_key=key, labels={"k": "1"})
    try:
        assert a.id == b.id
    finally:
        a.delete()


def test_exec_argv_stdin_env_cwd_timeout_and_check(sandbox):
    r = sandbox.exec(["/bin/sh", "-c", "cat; echo $X >&2"], stdin="hello\n", env={"X": "ex"}, cwd="/tmp")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.oom_killed, r.replayed) == (0, "hello\n", "ex\n", False, False, False)
    assert r.duration_ms >= 0 and r.command_id
    slow = sandbox.exec("sleep 5", timeout=0.3)
    assert slow.timed_out and not slow.ok
    failed = sandbox.exec("exit 3")
    assert failed.exit_code == 3  # a non-zero exit is a result, not an error
    with pytest.raises(CommandFailed) as info:
        sandbox.exec("echo nope >&2; exit 4", check=True)
    assert info.value.result.exit_code == 4 and "nope" in info.value.result.stderr
    assert sandbox.exec("true", check=True).ok


def test_command_id_replays_instead_of_running_twice(sandbox):
    first = sandbox.exec("echo x >> /tmp/count; wc -l < /tmp/count", command_id="turn-1")
    again = sandbox.exec("echo x >> /tmp/count; wc -l < /tmp/count", command_id="turn-1")
    assert (first.stdout, first.replayed) == ("1\n", False)
    assert (again.stdout, again.replayed) == ("1\n", True)
    log = sandbox.commands()
    assert [c["commandId"] for c in log].count("turn-1") == 1


def test_command_log_is_read_whole_by_cursor(sandbox):
    for i in range(23):
        sandbox.exec(["echo", str(i)], command_id=f"page-{i}")
    first = sandbox.command_page(limit=10)
    assert [c["commandId"] for c in first["commands"]] == [f"page-{i}" for i in range(10)] and first["nextCursor"]
    second = sandbox.command_page(first["nextCursor"], limit=10)
    assert [c["commandId"] for c in second["commands"]] == [f"page-{i}" for i in range(10, 20)]
    log = list(sandbox.iter_commands(page_size=10))
    assert [c["commandId"] for c in log] == [f"page-{i}" for i in range(23)]
    assert [c["result"]["stdout"] for c in log] == [f"{i}\n" for i in range(23)]
    last = sandbox.command_page(second["nextCursor"], limit=10)
    assert "nextCursor" not in last and len(last["commands"]) == 3
    sandbox.exec("true", command_id="page-later")
    assert [c["commandId"] for c in sandbox.command_page(last["cursor"])["commands"]] == ["page-later"]
    with pytest.raises(InvalidRequest):
        sandbox.command_page("not-a-cursor")


def test_stream_gives_output_in_order_then_exit(sandbox):
    events = list(sandbox.stream("for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.05; done; exit 2"))
    assert events[-1].type == "exit" and events[-1].result.exit_code == 2
    out = "".join(e.data for e in events if e.type == "stdout")
    err = "".join(e.data for e in events if e.type == "stderr")
    assert (out, err) == ("out1\nout2\nout3\n", "err1\nerr2\nerr3\n")


def test_background_command_status_and_follow(sandbox):
    status = sandbox.exec_background("echo started; sleep 0.5; echo finished", command_id="bg-1")
    assert status.command_id == "bg-1" and status.state in ("queued", "running")
    followed = list(sandbox.stream("ignored: the log has bg-1", command_id="bg-1"))
    assert "".join(e.data for e in followed if e.type == "stdout") == "started\nfinished\n"
    done = sandbox.command("bg-1")
    assert done.state == "done" and done.result.exit_code == 0 and done.stdout == "started\nfinished\n"


def test_stdin_and_signal_by_command_id(sandbox):
    sandbox.exec_background(["cat"], command_id="cat-py", stdin_open=True)
    _wait_state(sandbox, "cat-py", "running")
    sandbox.write_stdin("cat-py", "from ")
    assert sandbox.write_stdin("cat-py", "python\n", eof=True)["state"] == "running"
    done = _wait_state(sandbox, "cat-py", "done")
    assert done.stdout == "from python\n" and done.result.exit_code == 0
    sandbox.exec_background("sleep 600", command_id="sleep-py")
    _wait_state(sandbox, "sleep-py", "running")
    sandbox.signal("sleep-py", "SIGKILL")
    assert _wait_state(sandbox, "sleep-py", "done").result.exit_code == 137
    with pytest.raises(RollboxError) as caught:
        sandbox.signal("sleep-py", "TERM")
    assert caught.value.code == "invalid_state"


def test_pty_command_resizes_takes_keys_and_is_followed(sandbox):
    status = sandbox.pty("stty size; read line; echo \"got $line\"; stty size", cols=40, rows=12, command_id="pty-py")
    assert status.command_id == "pty-py"
    deadline = time.monotonic() + 20
    while "12 40" not in sandbox.command("pty-py").stdout:
        assert time.monotonic() < deadline, "no first size"
        time.sleep(0.05)
    assert sandbox.resize("pty-py", 90, 30)["state"] == "running"
    sandbox.write_stdin("pty-py", "hello\n")
    events = list(sandbox.follow("pty-py"))
    # The terminal's own line ends (CR LF) come through, and its echo of the typed line.
    assert "".join(e.data for e in events if e.type == "pty") == "12 40\r\nhello\r\ngot hello\r\n30 90\r\n"
    assert events[-1].type == "exit" and events[-1].result.exit_code == 0


def _wait_state(sandbox, command_id, state, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        status = sandbox.command(command_id)
        if status.state == state:
            return status
        assert time.monotonic() < deadline, f"{command_id} still {status.state}"
        time.sleep(0.05)


def test_files_read_write_and_directories_as_tar(sandbox, tmp_path):
    sandbox.files.write("/work/a/hello.sh", "echo hi\n", mode="0755")
    assert sandbox.files.read("/work/a/hello.sh") == b"echo hi\n"
    assert sandbox.exec("/work/a/hello.sh").stdout == "hi\n"
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "README").write_bytes(b"\x00\x01binary")
    os.symlink("pkg/mod.py", src / "link")
    sandbox.files.upload(str(src), "/work/repo")
    assert sandbox.exec("cat /work/repo/link; ls /work/repo | sort").stdout == "X = 1\nREADME\nlink\npkg\n"
    sandbox.exec("echo result > /work/repo/out.txt")
    dest = tmp_path / "dest"
    sandbox.files.download("/work/repo", str(dest))
    assert (dest / "out.txt").read_text() == "result\n" and (dest / "README").read_bytes() == b"\x00\x01binary"
    assert os.readlink(dest / "link") == "pkg/mod.py"
    with tarfile.open(fileobj=io.BytesIO(sandbox.files.read_tar("/work/repo/out.txt"))) as t:
        assert t.getnames() == ["./out.txt"]
    with pytest.raises(NotFound):
        sandbox.files.read("/no/such/file")


def test_pause_resume_and_set_policy(sandbox):
    sandbox.exec("mkdir -p /srv/answers && echo 42 > /srv/answers/key")
    sample = sandbox.metrics()
    assert sample["memUsed"] > 0 and sample["cpuCount"] >= 1
    assert sandbox.pause().state == "paused"
    with pytest.raises(rollbox.InvalidState):
        sandbox.exec("true")
    assert sandbox.resume().state == "running"
    sandbox.set_policy(hidden_paths=["/srv/answers"])
    assert sandbox.exec("cat /srv/answers/key").exit_code != 0
    sandbox.set_policy(hidden_paths=[])
    assert sandbox.exec("cat /srv/answers/key").stdout == "42\n"


def test_hibernate_keeps_files(sandbox):
    sandbox.exec("echo kept > /root/f")
    assert sandbox.pause("hibernate").state == "hibernated"
    sandbox.resume()
    assert sandbox.exec("cat /root/f").stdout == "kept\n"


def test_snapshot_and_layers(client, sandbox):
    sandbox.exec("mkdir -p /opt/env && echo built > /opt/env/marker && echo secret > /opt/env/answer")
    name = f"py-snap-{uuid.uuid4().hex[:8]}"
    layer = sandbox.snapshot(name=name, exclude=["/opt/env/answer"])
    assert layer["digest"].startswith("sha256:")
    assert client.layers.get(name)["digest"] == layer["digest"]
    with client.sandboxes.create(image={"base": "busybox", "layers": [name]}) as child:
        assert child.exec("cat /opt/env/marker; ls /opt/env").stdout == "built\nmarker\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("etc/py-layer")
        data = b"from python\n"
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    uploaded = client.layers.upload(buf.getvalue(), name=f"py-up-{uuid.uuid4().hex[:8]}")
    assert any(l["digest"] == uploaded["digest"] for l in client.layers.list())
    with client.sandboxes.create(image={"base": "busybox", "layers": [uploaded["digest"]]}) as sb:
        assert sb.exec("cat /etc/py-layer").stdout == "from python\n"


def test_fork_into_children_and_from_a_snapshot(client, sandbox):
    sandbox.exec("echo parent > /root/state")
    key = f"py-fork-{uuid.uuid4().hex}"
    answer = sandbox.fork(3, labels={"branch": "py"}, resources={"memoryMiB": 96}, idempotency_key=key)
    assert (answer["parent"], answer["created"], answer["refused"], answer["processes"]) == (sandbox.id, 3, 0, False)
    assert sandbox.fork(3, labels={"branch": "py"}, resources={"memoryMiB": 96}, idempotency_key=key)["children"] == answer["children"]
    children = [client.sandbox(c["id"]) for c in answer["children"]]
    try:
        children[0].exec("echo mine > /root/state")
        for child in children[1:]:
            assert child.exec("cat /root/state").stdout == "parent\n"
            record = child.refresh().record
            assert record["lineage"] == {"parent": sandbox.id, "parentKind": "sandbox", "forkPoint": answer["forkPoint"], "forkedAt": answer["forkedAt"]}
            assert (record["spec"]["labels"], record["spec"]["resources"]["memoryMiB"]) == ({"branch": "py"}, 96)
        assert sandbox.exec("cat /root/state").stdout == "parent\n"
        with pytest.raises(rollbox.InvalidRequest):
            sandbox.fork(65)
        with pytest.raises(rollbox.NotFound):
            client.sandbox("sbx_nope").fork(1)
        kept = sandbox.fork(1, snapshot=f"py-fork-point-{uuid.uuid4().hex[:8]}")
        children.append(client.sandbox(kept["children"][0]["id"]))
        assert client.layers.get(kept["forkLayer"])["name"].startswith("py-fork-point-")
        layer = sandbox.snapshot(name=f"py-fork-snap-{uuid.uuid4().hex[:8]}")
        from_snap = client.sandboxes.fork_snapshot(layer["digest"], 1, env={"WHO": "snap"})
        assert from_snap["parentKind"] == "snapshot" and from_snap["created"] == 1
        with client.sandbox(from_snap["children"][0]["id"]) as child:
            assert child.exec("cat /root/state; echo $WHO").stdout == "parent\nsnap\n"
    finally:
        for child in children:
            child.delete()


def test_jobs_pause_and_resume(client):
    job = f"job-{uuid.uuid4().hex[:8]}"
    sbs = [client.sandboxes.create(job=job) for _ in range(2)]
    try:
        paused = client.jobs.pause(job)
        assert sorted(r["id"] for r in paused["results"]) == sorted(s.id for s in sbs)
        # On a loaded host a sandbox's pause may end `failed`, coded and retryable: a trainer pauses
        # the job again, and what is paused already stays `unchanged`.
        for _ in range(5):
            if all(r["outcome"] != "failed" for r in paused["results"]):
                break
            assert all(r["error"]["code"] for r in paused["results"] if r["outcome"] == "failed")
            time.sleep(1)
            paused = client.jobs.pause(job)
        assert all(s.refresh().state == "paused" for s in sbs)
        resumed = client.jobs.resume(job)
        for _ in range(5):
            if all(r["outcome"] != "failed" for r in resumed["results"]):
                break
            time.sleep(1)
            resumed = client.jobs.resume(job)
        assert all(s.refresh().state == "running" for s in sbs)
    finally:
        for s in sbs:
            s.delete()


def test_run_keeps_failure_classes_apart(client):
    ok = client.run("cat in.txt; echo made > out.txt", files={"in.txt": "data\n"}, fetch=["out.txt"])
    assert (ok.status, ok.exit_code, ok.stdout, ok.files) == ("ok", 0, "data\n", {"out.txt": b"made\n"})
    assert client.run(["/bin/sh", "-c", "exit 5"]).status == "failed"
    timed = client.run("sleep 5", timeout=0.3)
    assert timed.status == "timeout" and timed.exit_code is None


def test_typed_errors_carry_the_api_code(client, stack):
    with pytest.raises(NotFound) as info:
        client.sandbox("sbx_doesnotexist").exec("true")
    assert info.value.code == "not_found" and info.value.status == 404
    with pytest.raises(InvalidRequest):
        client.sandboxes.create(resources={"memoryMiB": -1})
    with pytest.raises(rollbox.Unauthenticated):
        Rollbox(stack["url"], "not-a-token").sandboxes.list()
    with pytest.raises(rollbox.Forbidden):
        Rollbox(stack["url"], stack["tokens"]["other"]).sandboxes.create()


def test_error_classes_match_the_api_error_table():
    table = (os.path.dirname(__file__) + "/../../../docs/errors.md")
    codes = {line.split("`")[1] for line in open(table) if line.startswith("| `")}
    assert codes == set(rollbox.errors.ERRORS_BY_CODE)
