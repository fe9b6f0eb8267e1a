"""Typed errors. Each carries a stable machine-readable ``code`` and whether a retry can help.

The classes follow the status contract in the reliability design: the protocol layer maps each
one to exactly one gRPC status, the gateway to one HTTP status / SSE error code. Validation
raises these; it never uses ``assert`` (stripped by ``python -O``).
"""

from __future__ import annotations

from typing import ClassVar


class MeshnetError(Exception):
    """Base of every error meshnet raises on purpose."""

    code: ClassVar[str] = "internal"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(MeshnetError):
    """Malformed input: a bad request, frame, tensor bundle, range or option."""

    code = "invalid_argument"


class ArtifactError(InvalidArgument):
    """A GGUF or slice file that is truncated, corrupt, or not what it claims to be."""

    code = "invalid_artifact"


class SplitSetInvalid(ArtifactError):
    """A ``gguf-split`` set with a part missing, truncated, out of order or from another set.

    ``part`` names the file at fault, so the user knows which download to repeat."""

    code = "invalid_split_set"

    def __init__(self, message: str, part: str = "") -> None:
        super().__init__(message)
        self.part = part


class UnsupportedArchitecture(ArtifactError):
    """The model's architecture has no certified adapter: we fail closed rather than guess."""

    code = "unsupported_architecture"


class UnsupportedModelVariant(UnsupportedArchitecture):
    """A certified family, but a variant or cut its adapter refuses (e.g. Gemma 3 27B, whose
    attention scale llama.cpp infers from the layer count, so any slice of it computes otherwise)."""

    code = "unsupported_model_variant"


class LayerMetadataMismatch(ArtifactError):
    """A per-layer metadata array whose length is not the file's block count: llama.cpp would
    refuse it, or (for arrays it does not length-check) read the wrong layer's value."""

    code = "layer_metadata_mismatch"


class ProvenanceMismatch(ArtifactError):
    """A slice whose recorded source, range or hash does not match what it was loaded for."""

    code = "provenance_mismatch"


class ChatTemplateMissing(InvalidArgument):
    """Chat was asked of a model whose GGUF has no chat template (a base model) and none was given."""

    code = "chat_template_missing"


class GrammarTooLarge(InvalidArgument):
    """A JSON schema whose grammar would exceed the size limit (refused before it is built)."""

    code = "grammar_too_large"


class GrammarTooComplex(InvalidArgument):
    """A JSON schema whose grammar could not be built within the gateway's deadline."""

    code = "grammar_too_complex"


class ContextLengthExceeded(InvalidArgument):
    """Prompt plus max_tokens do not fit the per-session context of the shards on the route."""

    code = "context_length_exceeded"


class IntegrityError(MeshnetError):
    """A checksum did not match: bytes were damaged in transit or at rest."""

    code = "integrity_error"


class StorageDamaged(IntegrityError):
    """A database that fails its integrity check: it is never served or written to, so an
    operator can restore or recover it (the message names the file and what to do)."""

    code = "storage_damaged"


class SnapshotRefused(IntegrityError):
    """A KV snapshot that is corrupt, of another recipe or layer range, or of other tokens than
    the session's: never restored (the session replays its tokens instead)."""

    code = "snapshot_refused"


class FailedPrecondition(MeshnetError):
    """A well-formed request that does not fit the current state (stale epoch, position gap)."""

    code = "failed_precondition"


class Uncertified(FailedPrecondition):
    """A node's certification report does not certify the recipe it registers, or disagrees
    with what the recipe's other nodes computed: the tracker refuses to route to it."""

    code = "uncertified"


class RouteStale(FailedPrecondition):
    code = "route_stale"
    retryable = True


class ResourceExhausted(MeshnetError):
    """Admission refused: queue, KV or batch budget is full. Retry later, elsewhere."""

    code = "overloaded"
    retryable = True


class TrackerBusy(ResourceExhausted):
    """The tracker is behind on its work and sheds this call (probes first, then registrations,
    never the routes of live sessions): ask again after ``retry_after_s``, with jitter, not at
    once; a node's membership is not in question."""

    code = "tracker_busy"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CacheMiss(MeshnetError):
    """The session is unknown here or its KV was evicted; state is never silently rebuilt."""

    code = "cache_miss"
    retryable = True


class PrefixEvicted(CacheMiss):
    """The KV a session was opened to reuse (a prompt prefix, a snapshot) is no longer held
    here; the sender opens it again without reuse, and the route computes it from the tokens."""

    code = "prefix_evicted"


class Unavailable(MeshnetError):
    """A peer is gone or unreachable."""

    code = "worker_lost"
    retryable = True


class StepTimedOut(Unavailable):
    """A route gave no answer to a step within the budget its nodes' measured speeds allow
    (``core.step_budget``): a hop on it is hung, perhaps alive and answering health checks but
    not computing. The client sees a lost worker (failed over, else ``worker_lost``)."""


class Unreachable(Unavailable):
    """A control-plane service (tracker, gateway) cannot be reached: nothing was lost."""

    code = "unreachable"


class StorageUnavailable(Unavailable):
    """A component's own storage failed (disk full, I/O error, database locked): nothing was
    stored, and the same call succeeds once the disk is back, so callers keep what they sent
    and retry it."""

    code = "storage_unavailable"


class StorageFull(StorageUnavailable):
    """A component's store refuses every write because it is full (etcd's NOSPACE alarm): a
    retry succeeds only after its operator frees space, so the message says how. Still
    UNAVAILABLE: nothing was stored, callers keep what they sent and send it again later."""

    code = "storage_full"


class AddressUnproven(Unavailable):
    """A registration whose address cannot be checked now (another registration of the same node
    is being dialled back): nothing of that address is taken from a node serving there.
    Retryable. (A node that does not answer at its address is registered ``private`` instead:
    ``core.reachability``.)"""

    code = "address_unproven"


class NoRoute(Unavailable):
    """No chain of healthy compatible shards covers every layer."""

    code = "no_route"


class FeatureUnavailable(NoRoute):
    """No tail of the swarm serves a feature the request needs (its nodes predate it)."""

    code = "feature_unavailable"


class DeadlineExceeded(MeshnetError):
    code = "timeout"
    retryable = True


class Cancelled(MeshnetError):
    code = "cancelled"


class CertificationFailed(MeshnetError):
    """The pinned llama.cpp no longer behaves as the split engine assumes: refuse to serve."""

    code = "certification_failed"


class EngineError(MeshnetError):
    """llama.cpp returned an error for a batch."""

    code = "engine_error"


class Unauthenticated(MeshnetError):
    """No usable identity: no client certificate, one from another CA, expired or revoked."""

    code = "unauthenticated"


class PermissionDenied(MeshnetError):
    """A known peer asking for what its role or identity does not allow."""

    code = "permission_denied"


class TicketRefused(PermissionDenied):
    """An opening frame whose route ticket is missing, not the tracker's, expired, or does not
    name this session, this hop, its next hop or its sender: the shard opens nothing and dials
    nothing (``core.tickets``)."""

    code = "ticket_refused"
