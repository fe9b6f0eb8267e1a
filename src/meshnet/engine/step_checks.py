"""What an engine refuses before llama.cpp sees a batch: every input of it, checked against the
shard's shape (pure: no llama.cpp, so the fake engine and tests share it)."""

from __future__ import annotations

import numpy as np

from meshnet.core.errors import InvalidArgument, ResourceExhausted
from meshnet.engine.backend import ShardShape, StepInput


def check_batch(batch: list[StepInput], shape: ShardShape, vocab: int) -> None:
    """InvalidArgument (ResourceExhausted past the context) for the first input that does not fit
    ``shape``: slots in range and not repeated, the input kind the role takes, its dtype, width
    and values, positions within a session's context. ``vocab``: the token ids it accepts."""
    seen: set[int] = set()
    for step in batch:
        if not 0 <= step.slot < shape.max_slots or step.slot in seen:
            raise InvalidArgument(f"slot {step.slot} is out of range or repeated in one batch")
        seen.add(step.slot)
        _check_input(step, shape, vocab)
        if step.n_tokens == 0:
            raise InvalidArgument("an input with no tokens")
        if step.position < 0:
            raise InvalidArgument(f"position {step.position} is negative")
        if step.position + step.n_tokens > shape.n_ctx_per_slot:
            raise ResourceExhausted(
                f"positions {step.position}..{step.position + step.n_tokens} exceed the "
                f"{shape.n_ctx_per_slot}-token context of a session"
            )


def _check_input(step: StepInput, shape: ShardShape, vocab: int) -> None:
    if (step.tokens is None) == (step.hidden is None):
        raise InvalidArgument("give either token ids or a hidden state, not both or neither")
    if shape.takes_tokens != (step.tokens is not None):
        wanted = "token ids" if shape.takes_tokens else "a boundary hidden state"
        raise InvalidArgument(f"this {shape.role} shard takes {wanted}")
    hidden = step.hidden
    if hidden is not None:
        if hidden.dtype != np.float32 or hidden.ndim != 2 or hidden.shape[1] != shape.n_embd:
            got = f"{hidden.dtype} {hidden.shape}"
            raise InvalidArgument(f"boundary hidden state must be float32 [n, {shape.n_embd}], got {got}")
        if not np.isfinite(hidden).all():
            raise InvalidArgument("boundary hidden state holds NaN or infinity")
    tokens = step.tokens
    if tokens is not None:
        if tokens.ndim != 1 or tokens.dtype != np.int32:
            raise InvalidArgument("token ids must be int32 [n]")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise InvalidArgument(f"token ids must lie in [0, {vocab})")
