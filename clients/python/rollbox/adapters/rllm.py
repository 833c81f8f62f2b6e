"""
rLLM's `Sandbox` protocol (rllm/sandbox/protocol.py) on a rollbox sandbox:

    from rollbox.adapters.rllm import RollboxSandbox
    sandbox = RollboxSandbox(base_url="http://gateway:8080", token=TOKEN, image="python")
    sandbox.upload_dir("./repo", "/work/repo")
    print(sandbox.exec("cd /work/repo && python -m pytest -q", timeout=600))
    sandbox.close()
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from ..client import Rollbox, Sandbox


class RollboxSandbox:
    """exec / upload_file / upload_dir / close / is_alive, synchronous, like rLLM's backends."""

    def __init__(self, client: Optional[Rollbox] = None, *, base_url: Optional[str] = None, token: Optional[str] = None,
                 image: Optional[Any] = None, resources: Optional[Mapping[str, Any]] = None, network: Optional[Mapping[str, Any]] = None,
                 env: Optional[Mapping[str, str]] = None, job: Optional[str] = None, sandbox: Optional[Sandbox] = None):
        self.client = client or Rollbox(base_url, token)
        self.sandbox = sandbox or self.client.sandboxes.create(image=image, resources=resources, network=network, env=env, job=job)
        self._closed = False

    def exec(self, command: str, timeout: Optional[float] = None, user: Optional[str] = None) -> str:
        """stdout of `command` (`sh -c`); a non-zero exit raises RuntimeError, as rLLM's backends do."""
        result = self.sandbox.exec(command, timeout=timeout)
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout} s: {command}\n{result.stdout}{result.stderr}")
        if result.exit_code != 0:
            raise RuntimeError(f"Command failed (exit {result.exit_code}): {command}\n{result.stdout}{result.stderr}")
        return result.stdout

    def upload_file(self, local_path: str, remote_path: str) -> None:
        with open(local_path, "rb") as f:
            self.sandbox.files.write(remote_path, f.read(), mode=oct(os.stat(local_path).st_mode & 0o777)[2:].rjust(4, "0"))

    def upload_dir(self, local_path: str, remote_path: str) -> None:
        self.sandbox.files.upload(local_path, remote_path)

    def close(self) -> None:
        if not self._closed:
            self.sandbox.delete()
            self._closed = True

    def is_alive(self) -> bool:
        """Never raises: any error in the check means False."""
        try:
            return not self._closed and self.sandbox.refresh().state == "running"
        except Exception:  # noqa: BLE001 - the protocol's rule
            return False
