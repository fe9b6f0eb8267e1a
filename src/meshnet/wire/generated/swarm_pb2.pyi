from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SwarmJoinRequest(_message.Message):
    __slots__ = ("invite_secret", "csr_pem")
    INVITE_SECRET_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    invite_secret: str
    csr_pem: bytes
    def __init__(self, invite_secret: _Optional[str] = ..., csr_pem: _Optional[bytes] = ...) -> None: ...

class SwarmRenewRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    def __init__(self, csr_pem: _Optional[bytes] = ...) -> None: ...

class SwarmCertificateReply(_message.Message):
    __slots__ = ("node_id", "role", "cert_pem", "ca_pem", "not_after_unix_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: str
    cert_pem: bytes
    ca_pem: bytes
    not_after_unix_s: float
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[str] = ..., cert_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ..., not_after_unix_s: _Optional[float] = ...) -> None: ...

class SwarmRevokeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class SwarmRevokeReply(_message.Message):
    __slots__ = ("newly_revoked", "was_routed")
    NEWLY_REVOKED_FIELD_NUMBER: _ClassVar[int]
    WAS_ROUTED_FIELD_NUMBER: _ClassVar[int]
    newly_revoked: bool
    was_routed: bool
    def __init__(self, newly_revoked: _Optional[bool] = ..., was_routed: _Optional[bool] = ...) -> None: ...
