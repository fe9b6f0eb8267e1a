"""Who holds which artifact: the tracker's directory of holders, and the values it exchanges.

Holders (seeders, workers that fetched their range) announce everything they hold; each
announcement replaces the last, and a holder silent for ``ttl_s`` is forgotten, so a dead
holder leaves the answers within one TTL. Answers are sorted, so two trackers (or two calls)
given the same announcements answer the same. The clock is injected; nothing here does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
MAX_ADVERTISED = 1 << 16
Clock = Callable[[], float]


@dataclass(frozen=True)
class HeldManifest:
    model_id: str
    manifest_sha256: str


@dataclass(frozen=True)
class Advertisement:
    holder_id: str
    address: str
    artifacts: frozenset[str]
    manifests: tuple[HeldManifest, ...] = ()

    def __post_init__(self) -> None:
        if not self.holder_id or not self.address:
            raise InvalidArgument("an artifact advertisement needs a holder id and an address")
        if len(self.artifacts) + len(self.manifests) > MAX_ADVERTISED:
            raise InvalidArgument(f"an advertisement may name at most {MAX_ADVERTISED} artifacts")
        digests = [*self.artifacts, *(m.manifest_sha256 for m in self.manifests)]
        bad = [d for d in digests if not SHA256_HEX.match(d)]
        if bad:
            raise InvalidArgument(f"advertised digest {bad[0][:70]!r} is not 64 lowercase hex digits")


@dataclass(frozen=True)
class HolderInfo:
    holder_id: str
    address: str
    artifacts: tuple[str, ...]
    """Those of the asked-for artifacts (and the model's manifests) this holder holds."""


@dataclass(frozen=True)
class FoundHolders:
    holders: tuple[HolderInfo, ...]
    manifests: tuple[str, ...]
    """Digests of the asked-for model's manifests that some live holder holds."""


class HolderDirectory:
    def __init__(self, clock: Clock, ttl_s: float) -> None:
        self._clock = clock
        self.ttl_s = ttl_s
        self._held: dict[str, tuple[Advertisement, float]] = {}

    def advertise(self, advertisement: Advertisement) -> None:
        self._held[advertisement.holder_id] = (advertisement, self._clock())

    def forget(self, holder_id: str) -> None:
        self._held.pop(holder_id, None)

    def live(self) -> list[Advertisement]:
        now = self._clock()
        self._held = {k: v for k, v in self._held.items() if now - v[1] <= self.ttl_s}
        return [advertisement for advertisement, _ in sorted(self._held.values(), key=lambda v: v[0].holder_id)]

    def find(self, model_id: str, artifacts: Iterable[str]) -> FoundHolders:
        wanted = set(artifacts)
        live = self.live()
        manifests = sorted({m.manifest_sha256 for a in live for m in a.manifests if model_id == m.model_id != ""})
        holders = []
        for advertisement in live:
            held = {m.manifest_sha256 for m in advertisement.manifests} & set(manifests)
            held |= advertisement.artifacts & wanted
            if held:
                holders.append(HolderInfo(advertisement.holder_id, advertisement.address, tuple(sorted(held))))
        return FoundHolders(tuple(holders), tuple(manifests))
