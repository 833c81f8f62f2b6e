"""rollbox: Python client for rollbox sandboxes. `rollbox.aio` is the asyncio twin (needs httpx)."""
from ._core import RetryPolicy, Timeouts
from .batches import Batches
from .rollouts import Rollouts
from .client import Files, Jobs, Layers, Rollbox, Sandbox, Sandboxes
from .errors import (
    AdmissionExhausted, CommandFailed, Conflict, ConnectionFailed, Forbidden, ImageNotFound, ImagePullTimeout, Internal, RangeNotSatisfiable, InvalidArchive,
    InvalidImage, InvalidLayer, InvalidRequest, InvalidState, ModelHoldExpired, ModelLimitExceeded, ModelUpstreamFailed, NetworkUnavailable, NoCapacity, NodeLost, NotFound, PayloadTooLarge,
    QuotaExceeded, NotImplementedByRollbox, TemplateNotReady, RegistryNotAllowed, RegistryUnauthorized, RegistryUnavailable, ResultUnknown, RollboxError, SnapshotFailed, SwapUnavailable, TierUnsupported, Timeout, Unauthenticated,
    Unavailable, InvalidDockerfile, BuildUnsupported, BuildStepFailed, PortClosed,
)
from .types import (
    Batch, BatchResult, BatchTaskStatus, CommandStatus, ExecResult, FollowedRollout, GradeResult, Rollout, RolloutOutcome, RunResult, StepResult, StreamEvent,
    Trajectory, TrajectoryEntry,
)

__version__ = "0.1.0"
__all__ = [
    "Rollbox", "Sandbox", "Sandboxes", "Files", "Jobs", "Layers", "Batches", "Rollouts", "Timeouts", "RetryPolicy",
    "ExecResult", "StreamEvent", "CommandStatus", "RunResult", "Batch", "BatchResult", "BatchTaskStatus", "StepResult", "GradeResult",
    "Rollout", "RolloutOutcome", "Trajectory", "TrajectoryEntry", "FollowedRollout",
    "RollboxError", "CommandFailed", "ConnectionFailed", "AdmissionExhausted", "Conflict", "Forbidden", "Internal",
    "InvalidArchive", "InvalidImage", "InvalidLayer", "InvalidRequest", "InvalidState", "NetworkUnavailable", "NoCapacity", "NodeLost",
    "NotFound", "PayloadTooLarge", "QuotaExceeded", "ResultUnknown", "Timeout", "Unauthenticated", "Unavailable",
    "ImageNotFound", "ImagePullTimeout", "RangeNotSatisfiable", "RegistryNotAllowed", "NotImplementedByRollbox", "TemplateNotReady", "SwapUnavailable", "RegistryUnauthorized", "RegistryUnavailable", "TierUnsupported",
    "SnapshotFailed", "ModelHoldExpired", "ModelLimitExceeded", "ModelUpstreamFailed",
    "InvalidDockerfile", "BuildUnsupported", "BuildStepFailed", "PortClosed",
]
