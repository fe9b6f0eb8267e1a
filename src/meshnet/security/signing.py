"""Publisher keys: Ed25519 key files, signatures over bytes, and the fingerprint a swarm trusts.

A publisher signs a model manifest once; every node that fetches it checks the signature and
that the key's fingerprint is one it trusts. The fingerprint is ``ed25519:`` plus the sha256 of
the raw 32-byte public key, so it names the key, not a file or a person.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from meshnet.core.errors import FailedPrecondition, IntegrityError

ALGORITHM = "ed25519"
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


class SignatureInvalid(IntegrityError):
    """A signature that does not verify: the signed bytes changed, or it was made by another key."""

    code = "signature_invalid"


class PublisherKeyError(FailedPrecondition):
    """A publisher key file that cannot be read, parsed or created safely."""

    code = "publisher_key_invalid"


@dataclass(frozen=True)
class PublisherKey:
    """A publisher's private key (held in memory only while publishing)."""

    private: Ed25519PrivateKey

    @property
    def public_key(self) -> bytes:
        return self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)


def fingerprint(public_key: bytes) -> str:
    """``ed25519:<sha256 of the raw public key>``."""
    return f"{ALGORITHM}:{hashlib.sha256(public_key).hexdigest()}"


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> None:
    """Raise ``SignatureInvalid`` unless ``signature`` is ``public_key``'s over ``message``."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        raise SignatureInvalid(
            f"an Ed25519 signature needs a {PUBLIC_KEY_BYTES}-byte key and {SIGNATURE_BYTES} bytes; "
            f"got {len(public_key)} and {len(signature)}"
        )
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        raise SignatureInvalid(f"the signature does not verify under {fingerprint(public_key)}") from None


def load_or_create_key(path: Path) -> tuple[PublisherKey, bool]:
    """The key at ``path``, or a new one written there with mode 0600; ``(key, created)``."""
    path = Path(path)
    if path.exists():
        return load_key(path), False
    key = PublisherKey(Ed25519PrivateKey.generate())
    pem = key.private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: never overwrite a key another publisher run just made; 0600 from the first byte.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise PublisherKeyError(f"cannot create the publisher key {path}: {error.strerror or error}") from None
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
        handle.flush()
        os.fsync(handle.fileno())
    return key, True


def load_key(path: Path) -> PublisherKey:
    """Read a PEM (PKCS#8, unencrypted) Ed25519 private key; refuse one others can read."""
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o077
        data = path.read_bytes()
    except OSError as error:
        raise PublisherKeyError(f"cannot read the publisher key {path}: {error.strerror or error}") from None
    if mode:
        raise PublisherKeyError(f"the publisher key {path} is readable by others (mode {oct(mode)}); chmod 600 it")
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise PublisherKeyError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise PublisherKeyError(f"{path} holds a {type(private).__name__}, not an Ed25519 key")
    return PublisherKey(private)
