"""The verl, rLLM and Harbor shapes driving real sandboxes through multi-turn tasks."""
import asyncio
from types import SimpleNamespace

import pytest

from rollbox.adapters.harbor import RollboxEnvironment
from rollbox.adapters.rllm import RollboxSandbox
from rollbox.adapters.verl import RollboxTool


def test_verl_tool_keeps_state_across_the_calls_of_one_trajectory(stack):
    async def trajectory():
        tool = RollboxTool({"rollbox_url": stack["url"], "token": stack["tokens"]["user"], "default_language": "bash", "default_timeout": 5})
        assert tool.name == "code_interpreter" and tool.get_openai_tool_schema()["function"]["parameters"]["required"] == ["code"]
        instance_id, created = await tool.create()
        other_id, _ = await tool.create()
        try:
            first, reward, metrics = await tool.execute(instance_id, {"code": "echo 41 > /tmp/state; echo written"})
            assert (first.text, reward, metrics["exit_code"]) == ("written\n", 0.0, 0)
            second, _, _ = await tool.execute(instance_id, {"code": "echo $(( $(cat /tmp/state) + 1 ))"})
            assert second.text == "42\n"
            failing, _, metrics = await tool.execute(instance_id, {"code": "echo oops >&2; exit 3"})
            assert failing.text == "oops\n\n[exit code 3]" and metrics["exit_code"] == 3
            slow, _, metrics = await tool.execute(instance_id, {"code": "sleep 5", "timeout": 0.3})
            assert slow.text.endswith("[timed out]") and metrics["timed_out"]
            isolated, _, _ = await tool.execute(other_id, {"code": "cat /tmp/state 2>&1 || echo none"})
            assert "none" in isolated.text  # another instance is another sandbox
            unsupported, _, _ = await tool.execute(instance_id, {"code": "x", "language": "cobol"})
            assert "unsupported language" in unsupported.text
            assert await tool.calc_reward(instance_id) == 0.0
        finally:
            await tool.release(instance_id)
            await tool.release(other_id)
            await tool.client.close()
        return instance_id

    asyncio.run(trajectory())


def test_rllm_sandbox_protocol(stack, tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "test.sh").write_text("[ \"$(cat /work/repo/answer)\" = 42 ]\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tmp_path / "run.sh").chmod(0o755)
    sandbox = RollboxSandbox(base_url=stack["url"], token=stack["tokens"]["user"])
    try:
        assert sandbox.is_alive()
        sandbox.upload_dir(str(tmp_path / "repo"), "/work/repo")
        sandbox.upload_file(str(tmp_path / "run.sh"), "/work/run.sh")
        assert sandbox.exec("/work/run.sh") == "ran\n"
        with pytest.raises(RuntimeError, match="exit 1"):
            sandbox.exec("sh /work/repo/test.sh")  # turn 1: the agent has not solved it yet
        sandbox.exec("echo 42 > /work/repo/answer")  # turn 2
        assert sandbox.exec("sh /work/repo/test.sh && echo passed") == "passed\n"  # turn 3
        with pytest.raises(RuntimeError, match="timed out"):
            sandbox.exec("sleep 5", timeout=0.3)
    finally:
        sandbox.close()
    assert not sandbox.is_alive()
    sandbox.close()  # idempotent
    broken = RollboxSandbox.__new__(RollboxSandbox)
    broken._closed, broken.sandbox = False, None  # is_alive must not raise, whatever is wrong
    assert broken.is_alive() is False


def test_harbor_environment(stack, tmp_path):
    async def trial():
        config = SimpleNamespace(cpus=0.5, memory_mb=128, storage_mb=256)
        env = RollboxEnvironment(environment_dir=tmp_path, environment_name="task", session_id="trial-7", trial_paths=None,
                                 task_env_config=config, rollbox_url=stack["url"], rollbox_token=stack["tokens"]["user"],
                                 persistent_env={"TASK": "seven"})
        assert RollboxEnvironment.type() == "rollbox" and not env.is_mounted
        assert env.resources == {"cpuMillis": 500, "memoryMiB": 128, "diskMiB": 256}
        await env.start(force_build=False)
        try:
            (tmp_path / "tests").mkdir()
            (tmp_path / "tests" / "test.sh").write_text("[ -f /work/solution ] && echo ok\n")
            await env.upload_dir(tmp_path / "tests", "/tests")
            failed = await env.exec("sh /tests/test.sh")
            assert failed.return_code == 1  # answered, not raised
            assert not await env.is_dir("/work")
            await env.exec("mkdir -p /work")
            assert await env.is_dir("/work")
            await env.exec("echo $TASK > solution", cwd="/work")
            passed = await env.exec("sh /tests/test.sh; cat /work/solution", env={"EXTRA": "1"})
            assert (passed.return_code, passed.stdout) == (0, "ok\nseven\n")
            assert await env.is_file("/work/solution") and not await env.is_file("/work/none")
            await env.download_file("/work/solution", tmp_path / "out" / "solution")
            assert (tmp_path / "out" / "solution").read_text() == "seven\n"
            await env.download_dir("/tests", tmp_path / "back")
            assert (tmp_path / "back" / "test.sh").exists()
            with pytest.raises(RuntimeError, match="timed out"):
                await env.exec("sleep 5", timeout_sec=0.3)
            await env.upload_file(tmp_path / "tests" / "test.sh", "/tests/copy.sh")
            assert (await env.exec("sh /tests/copy.sh")).return_code == 0
        finally:
            await env.stop(delete=True)

    asyncio.run(trial())
