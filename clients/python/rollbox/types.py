"""What the API answers, as plain dataclasses (snake_case; the raw JSON stays in `raw`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    oom_killed: bool
    duration_ms: float
    #: True when the result was recorded earlier (same command id) and the command did not run again.
    replayed: bool
    command_id: str = ""
    #: stdout or stderr was cut at the gateway's output cap.
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExecResult":
        return cls(
            exit_code=int(d["exitCode"]),
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            timed_out=bool(d["timedOut"]),
            oom_killed=bool(d["oomKilled"]),
            duration_ms=float(d["durationMs"]),
            replayed=bool(d.get("replayed", False)),
            command_id=d.get("commandId", ""),
            truncated=bool(d.get("truncated", False)),
        )


@dataclass(frozen=True)
class StreamEvent:
    """One event of a streamed command: `stdout`/`stderr` chunks in order, then one `exit` carrying the result."""

    type: str
    data: str = ""
    result: Optional[ExecResult] = None


@dataclass(frozen=True)
class CommandStatus:
    """A command of the log (a background one, say): `queued`, `running`, `done` or `unknown`."""

    command_id: str
    state: str
    stdout: str
    stderr: str
    result: Optional[ExecResult]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "CommandStatus":
        result = d.get("result")
        return cls(
            command_id=d["commandId"],
            state=d["state"],
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            result=ExecResult.from_json({**result, "commandId": d["commandId"], "replayed": False}) if result else None,
            raw=d,
        )


@dataclass(frozen=True)
class RunResult:
    """`POST /v1/run`: `status` is ok, failed (non-zero exit), timeout or infra_error (safe to retry)."""

    status: str
    exit_code: Optional[int]
    stdout: str
    stderr: str
    duration_ms: float
    total_ms: float
    #: Fetched files, path as asked -> bytes.
    files: Dict[str, bytes]
    oom_killed: bool = False
    truncated: bool = False
    sandbox_id: Optional[str] = None
    pool: Optional[str] = None
    error: Optional[Dict[str, str]] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "RunResult":
        import base64

        return cls(
            status=d["status"],
            exit_code=d.get("exitCode"),
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            duration_ms=float(d.get("durationMs", 0)),
            total_ms=float(d.get("totalMs", 0)),
            files={k: base64.b64decode(v) for k, v in (d.get("files") or {}).items()},
            oom_killed=bool(d.get("oomKilled", False)),
            truncated=bool(d.get("truncated", False)),
            sandbox_id=d.get("sandboxId"),
            pool=d.get("pool"),
            error=d.get("error"),
        )
