"""Typed errors: one class per code of the API's error table (docs/errors.md)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .types import ExecResult


class RollboxError(Exception):
    """An error answer of the API (or a failure to reach it), with its code."""

    code = "internal"

    def __init__(self, message: str, *, status: int = 0, code: Optional[str] = None, retry_after: Optional[float] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        if code is not None:
            self.code = code
        #: Seconds the server asked to wait before trying again (429 and 503 answers).
        self.retry_after = retry_after

    def __reduce__(self):  # exceptions cross process boundaries (multiprocessing, Ray)
        return (_rebuild_error, (type(self), self.message, self.status, self.code, self.retry_after))

    def __str__(self) -> str:
        return f"{self.code} ({self.status}): {self.message}" if self.status else f"{self.code}: {self.message}"


def _rebuild_error(cls, message, status, code, retry_after):
    return cls(message, status=status, code=code, retry_after=retry_after)


class InvalidRequest(RollboxError):
    code = "invalid_request"


class InvalidLayer(RollboxError):
    code = "invalid_layer"


class InvalidImage(RollboxError):
    code = "invalid_image"


class InvalidArchive(RollboxError):
    code = "invalid_archive"


class Unauthenticated(RollboxError):
    code = "unauthenticated"


class Forbidden(RollboxError):
    code = "forbidden"


class NotFound(RollboxError):
    code = "not_found"


class Conflict(RollboxError):
    code = "conflict"


class InvalidState(RollboxError):
    code = "invalid_state"


class ResultUnknown(RollboxError):
    """The command's host or init died while it ran: it may or may not have taken effect."""

    code = "result_unknown"


class PayloadTooLarge(RollboxError):
    code = "payload_too_large"


class QuotaExceeded(RollboxError):
    code = "quota_exceeded"


class Internal(RollboxError):
    code = "internal"


class AdmissionExhausted(RollboxError):
    code = "admission_exhausted"


class NoCapacity(RollboxError):
    code = "no_capacity"


class NetworkUnavailable(RollboxError):
    code = "network_unavailable"


class TierUnsupported(RollboxError):
    """The sandbox's tier (container, microvm) cannot do this, or no host runs that tier."""

    code = "tier_unsupported"


class SnapshotFailed(RollboxError):
    """A microVM's guest could not pack its writable layer, or its stream was refused; nothing was stored, the sandbox runs on."""

    code = "snapshot_failed"


class Unavailable(RollboxError):
    code = "unavailable"


class Timeout(RollboxError):
    """The API's `timeout` (504), or a client-side wait (create, HTTP read) that ran out."""

    code = "timeout"


class NodeLost(RollboxError):
    code = "node_lost"


class RangeNotSatisfiable(RollboxError):
    """A `Range` started past the end of the layer file asked for."""

    code = "range_not_satisfiable"


class ImageNotFound(RollboxError):
    """An image pull found no such repository, tag or digest in the registry."""

    code = "image_not_found"


class RegistryUnauthorized(RollboxError):
    """The registry refused the gateway's credentials for a pull (the operator's auth file)."""

    code = "registry_unauthorized"


class RegistryUnavailable(RollboxError):
    """An image pull could not reach the registry, or it stopped answering."""

    code = "registry_unavailable"


class ImagePullTimeout(RollboxError):
    """A create whose `image.ref` had to be pulled waited past the gateway's limit (the pull goes on), a pull ran past its own deadline (it failed), or `images.wait` ran out."""

    code = "image_pull_timeout"


class RegistryNotAllowed(RollboxError):
    """The gateway's egress policy refused a pull's registry, redirect or token realm (not allowed, not http(s), an internal address)."""

    code = "registry_not_allowed"


class SwapUnavailable(RollboxError):
    """A swap pause found no room on the sandbox's worker host (no swap space, or too full); the sandbox stays as it was."""

    code = "swap_unavailable"


class TemplateNotReady(RollboxError):
    """The E2B `base` template is still being built on this cluster (its first use); retry after `retry_after`."""

    code = "template_not_ready"


class NotImplementedByRollbox(RollboxError):
    """An E2B route or option rollbox does not serve; the message names how rollbox differs."""

    code = "not_implemented"


class ModelHoldExpired(RollboxError):
    """A model call was held (its job paused, its upstreams unreachable or unregistered) past the gateway's hold limit or its rollout's wall time."""

    code = "model_hold_expired"


class ModelLimitExceeded(RollboxError):
    """The rollout used up its model calls or tokens: the call was not made."""

    code = "model_limit_exceeded"


class ModelUpstreamFailed(RollboxError):
    """A model call's answer was cut short more often than the gateway's re-issues could mend, or a re-issue did not repeat what was already received."""

    code = "model_upstream_failed"


class ConnectionFailed(RollboxError):
    """The gateway could not be reached, or the connection dropped before an answer."""

    code = "connection"

    def __init__(self, message: str, *, maybe_sent: bool = True, **kwargs):
        super().__init__(message, **kwargs)
        #: False when the request certainly did not reach the gateway (refused, or a stale
        #: idle connection the server had closed): then any request is safe to send again.
        self.maybe_sent = maybe_sent

    def __reduce__(self):
        return (_rebuild_connection_failed, (self.message, self.maybe_sent))


def _rebuild_connection_failed(message, maybe_sent):
    return ConnectionFailed(message, maybe_sent=maybe_sent)


class CommandFailed(RollboxError):
    """`exec(..., check=True)` of a command that exited non-zero (or timed out); `result` is attached."""

    code = "command_failed"

    def __init__(self, result: "ExecResult"):
        what = "timed out" if result.timed_out else f"exited {result.exit_code}"
        super().__init__(f"command {result.command_id} {what}: {result.stderr[-500:]}")
        self.result = result

    def __reduce__(self):
        return (CommandFailed, (self.result,))


class InvalidDockerfile(RollboxError):
    """An image build's Dockerfile (or steps) does not parse; the message names the line."""

    code = "invalid_dockerfile"


class BuildUnsupported(RollboxError):
    """An image build asks for what the builder cannot honour (RUN --mount, HEALTHCHECK, ONBUILD...); the message names the line."""

    code = "build_unsupported"


class BuildStepFailed(RollboxError):
    """An image build's RUN step exited non-zero or ran out of time; the build record holds its output."""

    code = "build_step_failed"


class PortClosed(RollboxError):
    """Nothing listens on the sandbox's port a request through the port proxy asked for."""

    code = "port_closed"


ERRORS_BY_CODE: Dict[str, Type[RollboxError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest, InvalidLayer, InvalidImage, InvalidArchive, Unauthenticated, Forbidden, NotFound, Conflict, InvalidState,
        ResultUnknown, PayloadTooLarge, RangeNotSatisfiable, QuotaExceeded, Internal, AdmissionExhausted, NoCapacity, NetworkUnavailable,
        Unavailable, Timeout, NodeLost, ImageNotFound, RegistryUnauthorized, RegistryUnavailable, RegistryNotAllowed, ImagePullTimeout,
        TierUnsupported, SnapshotFailed, SwapUnavailable, TemplateNotReady, NotImplementedByRollbox,
        ModelHoldExpired, ModelLimitExceeded, ModelUpstreamFailed, InvalidDockerfile, BuildUnsupported, BuildStepFailed, PortClosed,
    )
}


def error_from_answer(status: int, body: bytes, retry_after: Optional[str]) -> RollboxError:
    """The typed error of an error answer (`{"error": {"code", "message"}}`)."""
    import json

    code, message = "internal", f"HTTP {status}"
    try:
        err = json.loads(body.decode("utf-8"))["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        if body:
            message = f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
    seconds: Optional[float] = None
    if retry_after:
        try:
            seconds = float(retry_after)
        except ValueError:
            seconds = None
    return ERRORS_BY_CODE.get(code, RollboxError)(message, status=status, code=code, retry_after=seconds)

