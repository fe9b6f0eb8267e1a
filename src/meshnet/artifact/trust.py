"""Which publisher keys this node trusts, per model id: pinned, or trusted on first use.

``--trust-publisher FINGERPRINT`` pins the key: only manifests it signed are accepted, and
nothing is recorded. Without a pin the first manifest a node accepts for a model id records its
signer in ``DATA_DIR/trusted-publishers.json`` (trust on first use, like SSH's known_hosts); a
later manifest for that model id signed by any other key is refused. The verdict is a pure
function; the store is a small JSON file written atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.hashing import partial_path
from meshnet.core.errors import IntegrityError

TRUST_FILE = "trusted-publishers.json"


class UntrustedPublisher(IntegrityError):
    """A manifest whose (valid) signature is by a key this node does not trust for its model."""

    code = "untrusted_publisher"


@dataclass(frozen=True)
class TrustVerdict:
    accepted: bool
    record: bool
    """Accepted on first use: remember this key for the model from now on."""
    reason: str


def judge_publisher(model_id: str, fingerprint: str, pinned: str | None, recorded: str | None) -> TrustVerdict:
    if pinned is not None:
        if fingerprint == pinned:
            return TrustVerdict(True, False, f"{model_id}: signed by the pinned key")
        return TrustVerdict(False, False, f"{model_id}: signed by {fingerprint}, not the pinned {pinned}")
    if recorded is None:
        return TrustVerdict(True, True, f"{model_id}: first manifest seen, trusting {fingerprint} from now on")
    if fingerprint == recorded:
        return TrustVerdict(True, False, f"{model_id}: signed by the key trusted on first use")
    return TrustVerdict(
        False, False, f"{model_id}: signed by {fingerprint}, but this node trusts {recorded} for it (first use)"
    )


class TrustStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / TRUST_FILE

    def _load(self) -> dict[str, str]:
        if not self.path.exists():
            return {}
        try:
            loaded = json.loads(self.path.read_text())
        except (OSError, ValueError):
            raise UntrustedPublisher(f"{self.path} is unreadable; fix or remove it to trust anew") from None
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            raise UntrustedPublisher(f"{self.path} is not a map of model ids to fingerprints")
        return loaded

    def recorded(self, model_id: str) -> str | None:
        return self._load().get(model_id)

    def record(self, model_id: str, fingerprint: str) -> None:
        trusted = {**self._load(), model_id: fingerprint}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = partial_path(self.path)
        try:
            partial.write_text(json.dumps(trusted, indent=1, sort_keys=True))
            os.replace(partial, self.path)
        finally:
            partial.unlink(missing_ok=True)
