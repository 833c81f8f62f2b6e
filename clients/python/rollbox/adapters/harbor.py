"""
Harbor's `BaseEnvironment` (as SkyRL drives it) on a rollbox sandbox. Constructed like
Harbor's environments, plus `rollbox_url` / `rollbox_token` / `image` keywords:

    env = RollboxEnvironment(environment_dir=Path("task/environment"), environment_name="task",
                             session_id="trial-1", trial_paths=paths, task_env_config=config,
                             rollbox_url="http://gateway:8080", rollbox_token=TOKEN, image="python")
    await env.start(force_build=False)
    result = await env.exec("pytest -q", cwd="/work", timeout_sec=600)   # .return_code, .stdout, .stderr
    await env.stop(delete=True)
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Union

from ..aio import AsyncRollbox, AsyncSandbox

try:
    from harbor.models.environment.base import ExecResult  # type: ignore
except ImportError:

    @dataclass
    class ExecResult:  # type: ignore[no-redef]
        return_code: int
        stdout: Optional[str] = None
        stderr: Optional[str] = None


class RollboxEnvironment:
    """start / stop / exec / upload_* / download_* (async), exec answering the exit code rather than raising."""

    def __init__(self, environment_dir: Optional[Path] = None, environment_name: str = "rollbox", session_id: str = "",
                 trial_paths: Any = None, task_env_config: Any = None, logger: Any = None, override_cpus: Optional[int] = None,
                 override_memory_mb: Optional[int] = None, override_storage_mb: Optional[int] = None, persistent_env: Optional[Dict[str, str]] = None,
                 *, rollbox_url: Optional[str] = None, rollbox_token: Optional[str] = None, image: Optional[Any] = None,
                 network: Optional[Dict[str, Any]] = None, **kwargs: Any):
        self.environment_dir, self.environment_name, self.session_id = environment_dir, environment_name, session_id
        self.trial_paths, self.task_env_config, self.logger = trial_paths, task_env_config, logger
        self.client = AsyncRollbox(rollbox_url, rollbox_token)
        self.image, self.network, self.persistent_env = image, network, dict(persistent_env or {})
        cpus = override_cpus or getattr(task_env_config, "cpus", None)
        memory_mb = override_memory_mb or getattr(task_env_config, "memory_mb", None)
        storage_mb = override_storage_mb or getattr(task_env_config, "storage_mb", None)
        self.resources = {k: v for k, v in (("cpuMillis", cpus and int(cpus * 1000)), ("memoryMiB", memory_mb), ("diskMiB", storage_mb)) if v}
        self.default_user = None
        self.sandbox: Optional[AsyncSandbox] = None

    @staticmethod
    def type() -> str:
        return "rollbox"

    @property
    def is_mounted(self) -> bool:
        return False  # the task directory is not bind-mounted: files travel through upload/download

    @property
    def supports_gpus(self) -> bool:
        return False

    @property
    def can_disable_internet(self) -> bool:
        return True  # network mode none is the default; an allowlist is opt-in

    def _require(self) -> AsyncSandbox:
        if self.sandbox is None:
            raise RuntimeError("the environment is not started")
        return self.sandbox

    async def start(self, force_build: bool = False) -> None:
        # The session id is the idempotency key: a start retried after a crash gets the same sandbox.
        self.sandbox = await self.client.sandboxes.create(
            image=self.image, resources=self.resources or None, network=self.network, env=self.persistent_env or None,
            labels={"harbor.session": self.session_id[:63]} if self.session_id else None,
            idempotency_key=f"harbor-{self.session_id}" if self.session_id else None,
        )

    async def stop(self, delete: bool = True) -> None:
        if self.sandbox is not None:
            await self.sandbox.delete()
            self.sandbox = None
        await self.client.close()

    async def exec(self, command: str, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                   timeout_sec: Optional[int] = None, user: Optional[Union[str, int]] = None) -> ExecResult:
        result = await self._require().exec(command, cwd=cwd, env={**self.persistent_env, **(env or {})} or None, timeout=timeout_sec)
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code)

    async def upload_file(self, source_path: Union[Path, str], target_path: str) -> None:
        mode = oct(os.stat(source_path).st_mode & 0o777)[2:].rjust(4, "0")
        await self._require().files.write(target_path, Path(source_path).read_bytes(), mode=mode)

    async def upload_dir(self, source_dir: Union[Path, str], target_dir: str) -> None:
        await self._require().files.upload(str(source_dir), target_dir)

    async def download_file(self, source_path: str, target_path: Union[Path, str]) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        Path(target_path).write_bytes(await self._require().files.read(source_path))

    async def download_dir(self, source_dir: str, target_dir: Union[Path, str]) -> None:
        await self._require().files.download(source_dir, str(target_dir))

    async def is_dir(self, path: str, user: Optional[Union[str, int]] = None) -> bool:
        return (await self._require().exec(f"test -d {shlex.quote(path)}")).exit_code == 0

    async def is_file(self, path: str, user: Optional[Union[str, int]] = None) -> bool:
        return (await self._require().exec(f"test -f {shlex.quote(path)}")).exit_code == 0


__all__ = ["RollboxEnvironment", "ExecResult"]
