"""The KV cache's element type: what a worker stores its keys and values as.

The names are ggml's (and llama.cpp's ``--cache-type-k/-v``). A quantized type stores blocks of
``block_elements`` values in ``block_bytes`` bytes (ggml's ``block_q8_0``: an f16 scale and 32
int8; ``block_q4_0``: an f16 scale and 32 nibbles), so a row of ``n`` values takes
``n / block_elements * block_bytes`` bytes. The memory model (``core.layer_costs``), the recipe
(a route never mixes KV types) and the engine's llama.cpp settings all read this one table.
"""

from __future__ import annotations

from enum import StrEnum

from meshnet.core.errors import InvalidArgument


class KvType(StrEnum):
    F16 = "f16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"

    @property
    def block_elements(self) -> int:
        """Values per ggml block."""
        return 1 if self is KvType.F16 else 32

    @property
    def block_bytes(self) -> int:
        """Bytes per ggml block."""
        return _BLOCK_BYTES[self]

    @property
    def quantized(self) -> bool:
        return self is not KvType.F16

    def row_bytes(self, elements: int) -> int:
        """Bytes of a row of ``elements`` values (ggml's ``ggml_row_size``; a partial block is
        stored whole)."""
        blocks = -(-elements // self.block_elements)
        return blocks * self.block_bytes

    @classmethod
    def parse(cls, text: str) -> KvType:
        try:
            return cls(text)
        except ValueError:
            choices = ", ".join(kind.value for kind in cls)
            raise InvalidArgument(f"KV type {text!r} is not one of {choices}") from None


_BLOCK_BYTES = {KvType.F16: 2, KvType.Q8_0: 34, KvType.Q4_0: 18}
