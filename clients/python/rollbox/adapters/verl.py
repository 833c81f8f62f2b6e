"""
A verl tool (the shape of `verl.tools.base_tool.BaseTool`) whose every instance is one
rollbox sandbox: state (files, installed packages) carries over between the tool calls
of one trajectory, unlike SandboxFusion's stateless runs. In a verl tool config:

    tools:
      - class_name: rollbox.adapters.verl.RollboxTool
        config: {rollbox_url: "http://gateway:8080", token: "...", image: "python", default_timeout: 30}
        tool_schema: {type: function, function: {name: code_interpreter, ...}}
"""
from __future__ import annotations

import shlex
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..aio import AsyncRollbox, AsyncSandbox

try:  # the real class when verl is installed, so verl's agent loop reads it as its own
    from verl.tools.schemas import ToolResponse  # type: ignore
except ImportError:

    @dataclass
    class ToolResponse:  # type: ignore[no-redef]
        text: Optional[str] = None
        image: Optional[List[Any]] = None
        video: Optional[List[Any]] = None


DEFAULT_SCHEMA: Dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run code in this trajectory's sandbox; files and installed packages persist between calls.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The code to run."},
                "language": {"type": "string", "enum": ["python", "bash"], "description": "Default python."},
            },
            "required": ["code"],
        },
    },
}

RUNNERS = {"python": ("/tmp/.rollbox_tool.py", "python3 {file}"), "bash": ("/tmp/.rollbox_tool.sh", "sh {file}")}


class RollboxTool:
    """verl BaseTool shape: `create` / `execute` / `calc_reward` / `release` (all async)."""

    def __init__(self, config: Dict[str, Any], tool_schema: Any = None):
        self.config = config
        self.tool_schema = tool_schema or DEFAULT_SCHEMA
        function = getattr(self.tool_schema, "function", None) or self.tool_schema.get("function", {})
        self.name = getattr(function, "name", None) or function.get("name", "code_interpreter")
        self.client = AsyncRollbox(config.get("rollbox_url"), config.get("token"))
        self.default_timeout = float(config.get("default_timeout", 30))
        self.default_language = config.get("default_language", "python")
        self._instances: Dict[str, AsyncSandbox] = {}

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> Tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid.uuid4())
        # The instance id is the idempotency key: a create retried by verl gets the same sandbox.
        self._instances[instance_id] = await self.client.sandboxes.create(
            image=self.config.get("image"), resources=self.config.get("resources"), network=self.config.get("network"),
            labels={"verl.instance": instance_id[:63]}, job=self.config.get("job"), idempotency_key=f"verl-{instance_id}",
        )
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: Dict[str, Any], **kwargs: Any) -> Tuple[ToolResponse, float, Dict[str, Any]]:
        sandbox = self._instances[instance_id]
        language = parameters.get("language", self.default_language)
        if language not in RUNNERS:
            return ToolResponse(text=f"unsupported language {language!r} (python or bash)"), 0.0, {}
        path, runner = RUNNERS[language]
        await sandbox.files.write(path, str(parameters.get("code", "")))
        result = await sandbox.exec(runner.format(file=shlex.quote(path)), timeout=float(parameters.get("timeout", self.default_timeout)))
        text = result.stdout + result.stderr
        if result.timed_out:
            text += "\n[timed out]"
        elif result.exit_code != 0:
            text += f"\n[exit code {result.exit_code}]"
        return ToolResponse(text=text), 0.0, {"exit_code": result.exit_code, "timed_out": result.timed_out, "duration_ms": result.duration_ms}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        sandbox = self._instances.pop(instance_id, None)
        if sandbox is not None:
            await sandbox.delete()
