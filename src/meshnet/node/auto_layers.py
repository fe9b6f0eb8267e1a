"""``--layers auto``: what each range of the model would cost this worker, ask the tracker which
range the swarm needs most within the memory budget, and serve that.

The costs are the one memory cost model's (``meshnet.core.layer_costs``: runtime, weights, the
KV of this worker's sessions, scratch, a head's table and a tail's LM head and vocabulary), the
same the capacity plan then counts with (``assembly.plan_worker_capacity``): the range the
tracker suggests holds ``--max-sessions`` sessions within the budget, so the plan keeps them all.
The tracker only adds what is already served (``tracker.placement``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.footprint import memory_footprint
from meshnet.core.addresses import TrackerOrder
from meshnet.core.devices import CPU, placement_budget
from meshnet.core.errors import DeadlineExceeded, InvalidArgument, Unavailable
from meshnet.core.layer_costs import LayerAdvice, LayerCosts, LayerQuestion, WorkerLoad, layer_costs
from meshnet.engine.devices import find_device
from meshnet.membership.tracker_client import TrackerClient
from meshnet.node.assembly import model_identity
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.wire.tls import LinkSecurity

log = logging.getLogger(__name__)

TRACKER_WAIT_S = 60.0
"""How long a starting worker keeps asking a tracker that does not answer yet."""


def model_costs(model: Path, load: WorkerLoad) -> LayerCosts:
    """What each range of ``model`` costs a worker holding ``load``, from its GGUF header."""
    return layer_costs(memory_footprint(model), load)


async def resolve_layers(config: WorkerConfig, security: LinkSecurity | None = None) -> WorkerConfig:
    """``config`` with a fixed range: as given, or the one the tracker suggests for its budget."""
    if config.layer_choice.fixed is not None:
        return config
    device = CPU if config.fake is not None else await asyncio.to_thread(find_device, config.device)
    # A GPU that takes every layer must hold the range: its device memory decides first.
    budget = placement_budget(config.memory_budget_bytes(), device, config.gpu_layers)
    if config.model is None or config.fake is not None or config.tracker is None or budget is None:
        raise InvalidArgument("--layers auto needs a GGUF --model, --tracker and --memory-budget-mb")
    model = config.model
    description = await asyncio.to_thread(describe_model, model)
    cache = SliceCache(config.data_dir / "cache")
    # The recipe on its device: the ranges the swarm needs are counted among that recipe's nodes.
    identity = await asyncio.to_thread(model_identity, config, cache, description, device)
    costs = await asyncio.to_thread(model_costs, model, config.memory_load())
    question = LayerQuestion(identity.recipe.fingerprint(), costs, budget)
    advice = await _ask(config.tracker, question, security, config.tracker_order)
    log.info("serving layers %s of %d: %s", advice.layers, costs.n_layers, advice.reason)
    # The budget stays: the capacity plan counts with the same costs, so it keeps every session.
    return dataclasses.replace(config, layer_choice=LayerChoice(advice.layers))


async def _ask(
    tracker: str, question: LayerQuestion, security: LinkSecurity | None, order: TrackerOrder
) -> LayerAdvice:
    deadline = time.monotonic() + TRACKER_WAIT_S
    async with TrackerClient(tracker, security=security, order=order) as client:
        while True:
            try:
                return await client.suggest_layers(question)
            except (Unavailable, DeadlineExceeded) as error:
                if time.monotonic() > deadline:
                    raise
                log.warning("tracker %s cannot suggest layers yet: %s", tracker, error.message)
                await asyncio.sleep(1.0)
