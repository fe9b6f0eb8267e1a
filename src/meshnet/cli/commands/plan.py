"""``meshnet plan MODEL --nodes 24G,16G,8G``: which layers each machine takes, what each holds,
the largest context and the most sessions that fit, or what would make the model fit; from the
model's header alone (``artifact.plan_source``), counted by the planner in ``core.swarm_plan``."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from meshnet.cli.common import Command
from meshnet.cli.flags import config_from_arguments
from meshnet.core.config_flags import cli
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import WorkerLoad
from meshnet.core.swarm_plan import NodeShare, Remedies, SwarmPlan, parse_size
from meshnet.node.config import WorkerConfig

MIB = 2**20
_WORKER: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(WorkerConfig)}
"""A worker's defaults: a plan with no --sessions, --context or --prefill-chunk plans for them."""
STORE_BYTES = int(_WORKER["prefix_cache_mb"] * MIB)
"""A worker's default reuse store, which fills what its budget leaves (up to this)."""
PARTS = ("weights", "kv", "scratch", "runtime", "head_table", "tail", "total")


@dataclass(frozen=True)
class PlanArguments:
    """``meshnet plan``: the split, memory, context and sessions for machines of given memory."""

    model: str = field(metadata=cli(positional=True))
    """A GGUF (whole or header-only), a manifest (or its folder) or a model id the data dir holds."""
    nodes: tuple[str, ...]
    """Each machine's memory for its worker, in route order (24G,16G,8G; K/M/G/T are powers of 1024)."""
    sessions: int = _WORKER["max_sessions"]
    """Sessions every node holds at once (a worker's --max-sessions)."""
    context: int = _WORKER["n_ctx_per_session"]
    """Positions per session (a worker's --context)."""
    prefill_chunk: int = _WORKER["prefill_chunk"]
    """Rows per llama_decode call (a worker's --prefill-chunk)."""
    kv_type: KvType = _WORKER["kv_type"]
    """What each worker stores keys and values as (a worker's --kv-type; q8_0 and q4_0 need
    flash attention, a worker's default)."""
    device: Literal["cpu", "gpu"] = "cpu"
    """cpu: --nodes is each machine's memory budget; gpu: each GPU's free memory, of which a worker
    plans 90% (the rest is the driver's and the backend's)."""
    json: bool = False
    """Print the plan as JSON."""


def cmd_plan(args: argparse.Namespace) -> int:
    from meshnet.artifact.plan_source import planned_model
    from meshnet.core.devices import DEVICE_HEADROOM
    from meshnet.core.limits import served_context
    from meshnet.core.swarm_plan import plan_swarm, remedies

    command = config_from_arguments(PlanArguments, args)
    sizes = [parse_size(text) for text in command.nodes]
    budgets = [int(size * DEVICE_HEADROOM) if command.device == "gpu" else size for size in sizes]
    model = planned_model(command.model, args.data_dir)
    served_context(model.context_length, command.context)  # what a worker would refuse, refused here
    load = WorkerLoad(command.sessions, command.context, command.prefill_chunk, command.kv_type)
    plan = plan_swarm(model.footprint, budgets, load, model.context_length)
    fixes = None if plan.fits else remedies(model.footprint, budgets, plan)
    if command.json:
        print(json.dumps(_document(model.name, command.device, plan, fixes), indent=1))
    else:
        print("\n".join(_lines(model.name, command.device, plan, fixes)))
    return 0 if plan.fits else 1


def _document(name: str, device: str, plan: SwarmPlan, fixes: Remedies | None) -> dict[str, Any]:
    nodes = [
        {"layers": str(node.layers), "budget_bytes": node.budget_bytes, "fits": node.fits}
        | {part: getattr(node, part) for part in PARTS}
        | {"reuse_store": node.reuse_store(STORE_BYTES)}
        for node in plan.nodes
    ]
    return {
        "model": name,
        "device": device,
        "load": dataclasses.asdict(plan.load) | {"kv_type": str(plan.load.kv_type)},
        "fits": plan.fits,
        "nodes": nodes,
        "largest_context": plan.largest_context,
        "most_sessions": plan.most_sessions,
        "trained_context": plan.max_context,
        "would_fit": None if fixes is None else dataclasses.asdict(fixes) | {"kv_type": _text(fixes.kv_type)},
    }


def _text(kind: KvType | None) -> str | None:
    return None if kind is None else str(kind)


def _lines(name: str, device: str, plan: SwarmPlan, fixes: Remedies | None) -> list[str]:
    load = plan.load
    lines = [
        f"{name}: {sum(len(n.layers) for n in plan.nodes)} layers on {len(plan.nodes)} node(s) ({device}), "
        f"{load.sessions} session(s) x {load.context:,} positions, {load.kv_type} KV, "
        f"prefill chunk {load.prefill_chunk}",
        "",
        f"{'node':<5}{'layers':>8}{'budget':>9}" + "".join(f"{p.replace('_', ' '):>11}" for p in PARTS) + "  (MiB)",
    ]
    lines += [_row(i, node) for i, node in enumerate(plan.nodes)]
    lines.append("")
    context = f"{plan.largest_context:,}" if plan.largest_context else "none"
    trained = " (the model's trained length)" if plan.largest_context == plan.max_context else ""
    lines.append(f"largest context with {load.sessions} session(s): {context}{trained}")
    lines.append(f"most sessions of {load.context:,} positions: {plan.most_sessions or 'none'}")
    if fixes is None:
        store = ", ".join(f"{node.reuse_store(STORE_BYTES) / MIB:.0f}" for node in plan.nodes)
        lines.append(f"prompt-reuse store in what each budget leaves (--prefix-cache-mb): {store} MiB")
        lines.append("fits: start each worker with --layers and --memory-budget-mb as above")
        return lines
    lines.append("DOES NOT FIT. Any one of these would:")
    more = " and ".join(f"{extra / MIB:,.0f} MiB more on node {i}" for i, extra in fixes.more_memory)
    lines.append(f"  - more memory: {more}")
    if fixes.context:
        lines.append(f"  - --context {fixes.context:,} (instead of {load.context:,})")
    if fixes.sessions:
        lines.append(f"  - --sessions {fixes.sessions} (instead of {load.sessions})")
    if not fixes.context and not fixes.sessions and fixes.single_session_context:
        lines.append(f"  - --sessions 1 --context {fixes.single_session_context:,}")
    if fixes.kv_type is not None:
        lines.append(f"  - --kv-type {fixes.kv_type} (instead of {load.kv_type})")
    if fixes.extra_node is not None:
        lines.append(f"  - one more node of {fixes.extra_node / MIB:,.0f} MiB")
    return lines


def _row(index: int, node: NodeShare) -> str:
    parts = "".join(f"{getattr(node, part) / MIB:>11.1f}" for part in PARTS)
    verdict = "" if node.fits else f"  OVER by {(node.total - node.budget_bytes) / MIB:,.1f}"
    return f"{index:<5}{node.layers!s:>8}{node.budget_bytes / MIB:>9.0f}{parts}{verdict}"


def plan_commands() -> dict[str, Command]:
    return {
        "plan": Command(
            cmd_plan,
            "plan layers, memory, context and sessions for machines of given memory (no weights needed)",
            (PlanArguments,),
        )
    }
