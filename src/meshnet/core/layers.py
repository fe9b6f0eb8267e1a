"""Half-open layer ranges: the unit of shard ownership."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument


@dataclass(frozen=True, order=True)
class LayerRange:
    """Layers ``start .. stop-1`` of a model: half-open, like Python slices.

    Half-open ranges make adjacency trivial (``a.stop == b.start``) and lengths exact
    (``stop - start``), which is why routes are chains of them.
    """

    start: int
    stop: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.stop <= self.start:
            raise InvalidArgument(
                f"layer range {self.start}:{self.stop} is empty or negative; write A:B with 0 <= A < B (B is exclusive)"
            )

    @classmethod
    def parse(cls, text: str) -> LayerRange:
        """Parse ``"A:B"`` (B exclusive)."""
        parts = text.strip().split(":")
        if len(parts) != 2:
            raise InvalidArgument(f"layer range {text!r} must look like A:B (B exclusive)")
        try:
            start, stop = int(parts[0]), int(parts[1])
        except ValueError:
            raise InvalidArgument(f"layer range {text!r} must hold two integers, A:B") from None
        return cls(start, stop)

    def __len__(self) -> int:
        return self.stop - self.start

    def __str__(self) -> str:
        return f"{self.start}:{self.stop}"

    def __contains__(self, layer: object) -> bool:
        return isinstance(layer, int) and self.start <= layer < self.stop

    def check_within(self, n_layers: int) -> None:
        """Raise unless the range fits a model of ``n_layers`` layers."""
        if self.stop > n_layers:
            raise InvalidArgument(
                f"layer range {self} is out of bounds: the model has {n_layers} layers (0:{n_layers})"
            )

    def is_head(self) -> bool:
        return self.start == 0

    def is_tail(self, n_layers: int) -> bool:
        return self.stop == n_layers


def split_evenly(n_layers: int, n_shards: int) -> list[LayerRange]:
    """Cut ``[0, n_layers)`` into ``n_shards`` contiguous ranges whose sizes differ by at most one."""
    if n_shards < 1 or n_shards > n_layers:
        raise InvalidArgument(f"cannot split {n_layers} layers into {n_shards} shards")
    base, extra = divmod(n_layers, n_shards)
    ranges, start = [], 0
    for index in range(n_shards):
        stop = start + base + (1 if index < extra else 0)
        ranges.append(LayerRange(start, stop))
        start = stop
    return ranges
