"""What the API answers, as plain dataclasses (snake_case; the raw JSON stays in `raw`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


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


#: The states a batch ends in: no task runs again, and its results are all written.
TERMINAL_BATCH_STATES = frozenset({"completed", "cancelled", "failed", "expired"})


@dataclass(frozen=True)
class Batch:
    """
    An evaluation batch: `state` (validating, in_progress, finalizing, completed, cancelling,
    cancelled, failed, expired), `counts` (total, queued, running, succeeded, failed,
    timeout, infra_error, cancelled), its `options`, and when it entered each state.
    """

    id: str
    state: str
    counts: Dict[str, int]
    options: Dict[str, Any]
    timestamps: Dict[str, str]
    tenant: str = ""
    created_at: str = ""
    expires_at: str = ""
    #: Why it failed (an NDJSON line refused, say): {code, message}.
    error: Optional[Dict[str, str]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def done(self) -> bool:
        """True once it ended (completed, cancelled, failed or expired)."""
        return self.state in TERMINAL_BATCH_STATES

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Batch":
        return cls(
            id=d["id"],
            state=d["state"],
            counts=dict(d.get("counts") or {}),
            options=dict(d.get("options") or {}),
            timestamps=dict(d.get("timestamps") or {}),
            tenant=d.get("tenant", ""),
            created_at=d.get("createdAt", ""),
            expires_at=d.get("expiresAt", ""),
            error=d.get("error"),
            raw=d,
        )


@dataclass(frozen=True)
class StepResult:
    """One step (or the grade) of a batch task; `exit_code` is None when it did not exit by itself (a timeout)."""

    exit_code: Optional[int]
    stdout: str
    stderr: str
    truncated: bool
    timed_out: bool
    oom_killed: bool
    duration_ms: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @staticmethod
    def _fields(d: Dict[str, Any]) -> Dict[str, Any]:
        code = d.get("exitCode")
        return dict(exit_code=None if code is None else int(code), stdout=d.get("stdout", ""), stderr=d.get("stderr", ""),
                    truncated=bool(d.get("truncated", False)), timed_out=bool(d.get("timedOut", False)),
                    oom_killed=bool(d.get("oomKilled", False)), duration_ms=float(d.get("durationMs", 0)))

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "StepResult":
        return cls(**cls._fields(d))


@dataclass(frozen=True)
class GradeResult(StepResult):
    """The grade command's result, its `mode` (fresh-sandbox or same-sandbox) and whether it `passed`."""

    mode: str = "fresh-sandbox"
    passed: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "GradeResult":
        return cls(**cls._fields(d), mode=d.get("mode", "fresh-sandbox"), passed=bool(d.get("passed", False)))


@dataclass(frozen=True)
class RolloutOutcome:
    """What a hosted rollout attempt's model calls came to; `hit` is the first limit it hit (max_model_calls, max_tokens, wall_time), if any."""

    id: str
    model_calls: int
    tokens: int
    hit: Optional[str] = None
    #: Where its time went once its agent exited, ms: modelUpstream, modelHeld, tool, envWait, agent (they sum to total).
    times_ms: Optional[Dict[str, int]] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "RolloutOutcome":
        return cls(id=d.get("id", ""), model_calls=int(d.get("modelCalls", 0)), tokens=int(d.get("tokens", 0)), hit=d.get("hit"), times_ms=d.get("timesMs"))


@dataclass(frozen=True)
class BatchResult:
    """
    One line of a batch's results: a task that ended, `status` succeeded, failed (a step
    exited non-zero, or the task's input was refused), timeout, infra_error (the platform
    failed it `attempts` times) or cancelled. `cursor` is where to resume after it.
    """

    custom_id: str
    status: str
    steps: List[StepResult]
    grade: Optional[GradeResult]
    attempts: int
    sandbox_id: Optional[str]
    error: Optional[Dict[str, str]]
    cursor: str
    ended_at: str = ""
    #: A hosted rollout's agent command, when it ran.
    agent: Optional[StepResult] = None
    #: A hosted rollout's id (its trajectory's) and what its model calls came to.
    rollout: Optional[RolloutOutcome] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BatchResult":
        grade = d.get("grade")
        return cls(
            custom_id=d["customId"],
            status=d["status"],
            steps=[StepResult.from_json(s) for s in d.get("steps") or []],
            grade=GradeResult.from_json(grade) if grade else None,
            attempts=int(d.get("attempts", 0)),
            sandbox_id=d.get("sandboxId"),
            error=d.get("error"),
            cursor=d["cursor"],
            ended_at=d.get("endedAt", ""),
            agent=StepResult.from_json(d["agent"]) if d.get("agent") else None,
            rollout=RolloutOutcome.from_json(d["rollout"]) if d.get("rollout") else None,
            raw=d,
        )


@dataclass(frozen=True)
class BatchTaskStatus:
    """Where one task of a batch stands: `queued` (with its 0-based `position`), `running`, or `done` (with its `status`)."""

    custom_id: str
    state: str
    attempts: int
    position: Optional[int] = None
    status: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BatchTaskStatus":
        return cls(custom_id=d["customId"], state=d["state"], attempts=int(d.get("attempts", 0)), position=d.get("position"),
                   status=d.get("status"), raw=d)


@dataclass(frozen=True)
class Rollout:
    """
    A hosted rollout attempt (`<batchId>.<customId>.<attempt>`): where it ran, its task's state
    in its batch (`task`) and its model usage so far (`usage`, whose `id` is the rollout's).
    """

    id: str
    tenant: str
    job: str
    batch_id: str
    custom_id: str
    attempt: int
    task_sandbox_id: str
    agent_sandbox_id: str
    created_at: str
    task: BatchTaskStatus
    usage: RolloutOutcome
    #: Where its time went once its agent exited, ms (docs/rollouts.md "Where a rollout's time goes").
    times_ms: Optional[Dict[str, int]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Rollout":
        return cls(id=d["id"], tenant=d.get("tenant", ""), job=d.get("job", ""), batch_id=d["batchId"], custom_id=d["customId"],
                   attempt=int(d.get("attempt", 0)), task_sandbox_id=d.get("taskSandboxId", ""), agent_sandbox_id=d.get("agentSandboxId", ""),
                   created_at=d.get("createdAt", ""), task=BatchTaskStatus.from_json(d["task"]),
                   usage=RolloutOutcome.from_json({**d.get("usage", {}), "id": d["id"]}), times_ms=d.get("timesMs"), raw=d)


@dataclass(frozen=True)
class TrajectoryEntry:
    """
    One step of a trajectory, `kind` `model_call` (`call`: the gateway's record of it, as JSON)
    or `command` (`command`: the task sandbox's command record, `sandbox_id`), begun `at`.
    """

    kind: str
    at: str
    call: Optional[Dict[str, Any]] = None
    command: Optional[Dict[str, Any]] = None
    sandbox_id: Optional[str] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "TrajectoryEntry":
        return cls(kind=d["kind"], at=d.get("at", ""), call=d.get("call"), command=d.get("command"), sandbox_id=d.get("sandboxId"))


@dataclass(frozen=True)
class Trajectory:
    """A rollout's model calls and task-sandbox commands, in the order they began."""

    rollout_id: str
    entries: List[TrajectoryEntry]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Trajectory":
        return cls(rollout_id=d["rolloutId"], entries=[TrajectoryEntry.from_json(e) for e in d.get("entries") or []], raw=d)


@dataclass(frozen=True)
class FollowedRollout:
    """A finished task of a followed batch: its result line, its rollout's trajectory (None without an agent run), and the cursor to resume after it."""

    line: BatchResult
    trajectory: Optional[Trajectory]
    cursor: str
