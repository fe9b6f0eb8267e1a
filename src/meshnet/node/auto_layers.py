"""``--layers auto``: measure what each layer of the model costs, ask the tracker which range
the swarm needs most within the memory budget, and serve that.

The cost model is the placement planner's (``meshnet.core.layer_costs``): weights per block from
the GGUF header, the KV of this worker's sessions, the LM head for a tail, and the runtime every
process carries; the tracker only adds what is already served (``tracker.placement``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.core.errors import DeadlineExceeded, InvalidArgument, Unavailable
from meshnet.core.layer_costs import LayerAdvice, LayerCosts, LayerQuestion
from meshnet.membership.tracker_client import TrackerClient
from meshnet.node.assembly import model_identity
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.session.admission import kv_bytes_per_session
from meshnet.wire.tls import LinkSecurity

log = logging.getLogger(__name__)

RUNTIME_OVERHEAD_MB = 110
"""Resident memory of a worker beyond its weights and KV: Python, NumPy, gRPC, llama.cpp and its
compute buffers (measured: 148 MiB for a 10-layer SmolLM2 slice with two 2,048-position
sessions = 22 MiB weights + 31 MiB KV + this)."""
TRACKER_WAIT_S = 60.0
"""How long a starting worker keeps asking a tracker that does not answer yet."""


def layer_costs(model: Path, sessions: int, context: int) -> LayerCosts:
    """What each layer, the head and the tail of ``model`` need resident, from its GGUF header."""
    gguf = parse_gguf(model)
    description = describe_model(model)
    blocks = [0] * description.n_layers
    tail = 0
    for tensor in gguf.tensors.values():
        if tensor.name.startswith("blk."):
            blocks[int(tensor.name.split(".")[1])] += tensor.nbytes
        elif tensor.name.startswith("output") or (
            tensor.name == "token_embd.weight" and "output.weight" not in gguf.tensors
        ):
            tail += tensor.nbytes  # output norm and LM head (the token table when they are tied)
    kv = kv_bytes_per_session(context, 1, description.n_embd, description.n_head, description.n_head_kv)
    return LayerCosts(
        block_bytes=tuple(blocks),
        kv_bytes_per_layer=kv * sessions,
        tail_bytes=tail,
        fixed_bytes=RUNTIME_OVERHEAD_MB * 2**20,
    )


async def resolve_layers(config: WorkerConfig, security: LinkSecurity | None = None) -> WorkerConfig:
    """``config`` with a fixed range: as given, or the one the tracker suggests for its budget."""
    if config.layer_choice.fixed is not None:
        return config
    if config.model is None or config.fake is not None or config.tracker is None or config.memory_budget_mb is None:
        raise InvalidArgument("--layers auto needs a GGUF --model, --tracker and --memory-budget-mb")
    model = config.model
    description = await asyncio.to_thread(describe_model, model)
    identity = await asyncio.to_thread(model_identity, config, SliceCache(config.data_dir / "cache"), description)
    costs = await asyncio.to_thread(layer_costs, model, config.max_sessions, config.n_ctx_per_session)
    question = LayerQuestion(identity.recipe.fingerprint(), costs, int(config.memory_budget_mb * 2**20))
    advice = await _ask(config.tracker, question, security)
    log.info("serving layers %s of %d: %s", advice.layers, costs.n_layers, advice.reason)
    # The range was chosen so that max_sessions sessions fit the budget under the placement's
    # cost model (measured whole-process figures); cutting sessions again by the capacity
    # plan's separate, deliberately generous scratch estimate would count the budget twice.
    return dataclasses.replace(config, layer_choice=LayerChoice(advice.layers), memory_budget_mb=None)


async def _ask(tracker: str, question: LayerQuestion, security: LinkSecurity | None) -> LayerAdvice:
    deadline = time.monotonic() + TRACKER_WAIT_S
    async with TrackerClient(tracker, security=security) as client:
        while True:
            try:
                return await client.suggest_layers(question)
            except (Unavailable, DeadlineExceeded) as error:
                if time.monotonic() > deadline:
                    raise
                log.warning("tracker %s cannot suggest layers yet: %s", tracker, error.message)
                await asyncio.sleep(1.0)
