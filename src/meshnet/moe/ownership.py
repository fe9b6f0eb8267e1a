"""Expert parallelism's values: who owns which routed expert, and the slot rows nodes exchange.

Every node of an expert-parallel group runs the whole backbone on the same tokens; per MoE layer
each node computes only the slots (token, k-th selected expert) whose expert it owns and the
nodes swap those rows. The graph then folds the rows in slot order itself, which is why the
exchange carries rows and never partial sums (a sum of per-node partials rounds differently).
The pure checks here are the reduction's refusals: a row for a slot the receiver owns, a row
whose expert is not the one the receiver's router chose, a duplicate with different bits, and
a token whose selected experts did not all arrive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from meshnet.core.errors import InvalidArgument

FrameFault = Literal[
    "magic",
    "version",
    "dimension",
    "term_count",
    "width",
    "token_range",
    "slot_range",
    "expert_range",
    "trailing_bytes",
    "truncated",
    "too_large",
    "geometry",
    "checksum",
]


class ExpertFrameInvalid(InvalidArgument):
    """An expert-row exchange frame the receiver refuses before trusting any of it."""

    code = "expert_frame_invalid"

    def __init__(self, fault: FrameFault, message: str) -> None:
        super().__init__(f"expert row frame refused ({fault}): {message}")
        self.fault: FrameFault = fault


class ExpertRowsConflict(InvalidArgument):
    """Rows that disagree with the receiver: a duplicate with different bits, a row for a slot
    the receiver computes itself, or for an expert its own router did not select."""

    code = "expert_rows_conflict"


class ExpertRowsIncomplete(InvalidArgument):
    """A token's selected experts did not all arrive: the fold would sum a partial set."""

    code = "expert_rows_incomplete"


@dataclass(frozen=True)
class ExpertNumerics:
    """The settings of an expert node that change its arithmetic, hence belong to the recipe."""

    prefill_chunk: int
    flash_attn: bool
    repack: bool

    def flags(self) -> str:
        """As the command line spells them."""
        return " ".join(
            (
                f"--prefill-chunk {self.prefill_chunk}",
                "--flash-attn" if self.flash_attn else "--no-flash-attn",
                "--repack" if self.repack else "--no-repack",
            )
        )


def numerics_mismatch(own: ExpertNumerics, nodes: Sequence[tuple[int, ExpertNumerics | None]]) -> str | None:
    """Why a front with ``own`` settings may not serve a group whose nodes report ``nodes``
    ((index, settings or None when a node does not report them)); None if it may."""
    differing = [(index, theirs) for index, theirs in nodes if theirs is not None and theirs != own]
    if not differing:
        return None
    index, theirs = differing[0]
    return (
        f"expert node {index} computes with {theirs.flags()}, this front was started with {own.flags()}: "
        "they are part of the recipe, so start the front with the nodes' settings"
    )


@dataclass(frozen=True)
class ExpertOwnership:
    """Node ``index`` of ``count`` owns the routed experts ``{e : e mod count == index}``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise InvalidArgument(f"expert share {self.index}/{self.count}: write I/N with 0 <= I < N")

    @classmethod
    def parse(cls, text: str) -> ExpertOwnership:
        """Parse ``"I/N"``."""
        parts = text.strip().split("/")
        try:
            index, count = int(parts[0]), int(parts[1])
        except (ValueError, IndexError):
            raise InvalidArgument(f"expert share {text!r} must look like I/N, e.g. 0/2") from None
        if len(parts) != 2:
            raise InvalidArgument(f"expert share {text!r} must look like I/N, e.g. 0/2")
        return cls(index, count)

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def __str__(self) -> str:
        return self.label  # what ``parse`` reads: a launcher writes ``--experts`` with it

    def owned_mask(self, experts: np.ndarray) -> np.ndarray:
        """Boolean mask of the entries of ``experts`` this node computes."""
        return np.asarray(experts) % self.count == self.index

    def owned_experts(self, n_expert: int) -> tuple[int, ...]:
        return tuple(range(self.index, n_expert, self.count))

    def dummy_experts(self, n_expert: int, n_expert_used: int) -> np.ndarray:
        """int32 [k]: the experts non-local slots are pointed at, owned by other nodes, so this
        node's local experts keep exactly the row counts (and kernel paths) of the whole model.

        A token's non-local slots get distinct dummies: the repacked CPU kernels size each
        expert's row list for at most one row per token, so one shared dummy would overflow it."""
        others = [e for e in range(n_expert) if e % self.count != self.index]
        if len(others) < n_expert_used:
            raise InvalidArgument(
                f"{self.count} nodes cannot share {n_expert} experts with {n_expert_used} selected per token: "
                f"node {self.index} needs {n_expert_used} experts it does not own"
            )
        return np.array(others[:n_expert_used], np.int32)

    def steer(self, selected: np.ndarray, dummies: np.ndarray) -> np.ndarray:
        """``selected`` int32 [n_tokens, k] with each token's non-local slots renamed to
        ``dummies`` in slot order (local slots unchanged)."""
        foreign = ~self.owned_mask(selected)
        rank = np.cumsum(foreign, axis=1) - 1
        return np.where(foreign, dummies[np.clip(rank, 0, None)], selected).astype(np.int32)


@dataclass(frozen=True)
class ExchangeGeometry:
    """What sender and receiver must agree on before any row is placed."""

    n_embd: int
    n_expert: int
    n_expert_used: int
    n_layers: int
    group_size: int

    def __post_init__(self) -> None:
        if min(self.n_embd, self.n_expert, self.n_expert_used, self.n_layers, self.group_size) < 1:
            raise InvalidArgument(f"expert exchange geometry must be positive: {self}")
        if self.n_expert_used > self.n_expert or self.group_size > self.n_expert:
            raise InvalidArgument(f"expert exchange geometry is inconsistent: {self}")


@dataclass(frozen=True, eq=False)
class SlotRows:
    """One node's computed slot rows of one MoE layer in one graph run.

    ``sequence`` numbers the exchanges of a group (every node runs the same graphs, so the k-th
    exchange of each node is the same layer of the same batch); ``n_tokens`` is the row count of
    the MoE input in that graph (the last layer sees only the output rows)."""

    sequence: int
    layer: int
    sender: int
    n_tokens: int
    tokens: np.ndarray
    """int32 [m]: row index of each term within the MoE input."""
    slots: np.ndarray
    """int32 [m]: k-index of each term (its place in the fold)."""
    experts: np.ndarray
    """int32 [m]: the routed expert the sender computed for the term."""
    rows: np.ndarray
    """float32 [m, n_embd]: the weighted expert output (``ffn_moe_weighted``)."""

    @property
    def n_terms(self) -> int:
        return int(self.tokens.shape[0])


def local_rows(
    sequence: int, layer: int, ownership: ExpertOwnership, selected: np.ndarray, weighted: np.ndarray
) -> SlotRows:
    """The rows this node computed: ``selected`` int32 [n_tokens, k], ``weighted`` [n_tokens, k, n_embd]."""
    tokens, slots = np.nonzero(ownership.owned_mask(selected))
    return SlotRows(
        sequence,
        layer,
        ownership.index,
        int(selected.shape[0]),
        tokens.astype(np.int32),
        slots.astype(np.int32),
        selected[tokens, slots].astype(np.int32),
        np.ascontiguousarray(weighted[tokens, slots], dtype=np.float32),
    )


def place_rows(
    ownership: ExpertOwnership, selected: np.ndarray, received: list[SlotRows], weighted: np.ndarray
) -> None:
    """Write the other nodes' rows into ``weighted`` [n_tokens, k, n_embd] in place.

    Refuses rows for slots this node computed, rows whose expert this node's router did not
    select for that slot, duplicates with different bits, and an incomplete set."""
    n_tokens, k = selected.shape
    filled = ownership.owned_mask(selected).copy()
    first = np.zeros_like(filled)
    for part in received:
        if part.n_tokens != n_tokens:
            raise ExpertRowsConflict(
                f"node {part.sender} sent rows for {part.n_tokens} tokens, this graph has {n_tokens}"
            )
        if part.n_terms == 0:
            continue
        if part.tokens.max() >= n_tokens or part.slots.max() >= k or part.tokens.min() < 0 or part.slots.min() < 0:
            raise ExpertRowsConflict(f"node {part.sender} sent a row outside [{n_tokens}, {k}]")
        if (selected[part.tokens, part.slots] != part.experts).any():
            raise ExpertRowsConflict(f"node {part.sender} routed layer {part.layer} differently from this node")
        if ownership.owned_mask(part.experts).any():
            raise ExpertRowsConflict(f"node {part.sender} sent a row for an expert this node owns")
        _check_duplicates(part, first, weighted)
        fresh = ~filled[part.tokens, part.slots]
        weighted[part.tokens[fresh], part.slots[fresh]] = part.rows[fresh]
        filled[part.tokens, part.slots] = True
        first[part.tokens[fresh], part.slots[fresh]] = True
    if not filled.all():
        token = int(np.nonzero(~filled.all(axis=1))[0][0])
        raise ExpertRowsIncomplete(
            f"layer rows incomplete: token {token} is missing {int((~filled[token]).sum())} slots"
        )


def _check_duplicates(part: SlotRows, already: np.ndarray, weighted: np.ndarray) -> None:
    """A slot written twice must carry the same bits both times (also within one frame)."""
    seen = already[part.tokens, part.slots]
    keys = part.tokens.astype(np.int64) * (1 << 20) + part.slots
    unique, counts = np.unique(keys, return_counts=True)
    for key_index in np.nonzero(counts > 1)[0]:
        same = np.nonzero(keys == unique[key_index])[0]
        bits = part.rows[same].view(np.uint32)
        if (bits != bits[0]).any():
            raise ExpertRowsConflict(f"duplicate slot from node {part.sender} with different bits")
    for term in np.nonzero(seen)[0]:
        previous = weighted[part.tokens[term], part.slots[term]].view(np.uint32)
        if (previous != part.rows[term].view(np.uint32)).any():
            raise ExpertRowsConflict(f"duplicate slot from node {part.sender} with different bits")
