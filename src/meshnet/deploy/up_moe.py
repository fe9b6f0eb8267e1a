"""`meshnet up --expert-parallel N`: an expert-parallel group of N worker processes and a demo.

Each node is a ``meshnet worker --experts I/N`` process holding the whole backbone and 1/N of the
routed experts; the nodes know each other's loopback addresses before any starts (they open one
stream per peer pair). Once all are ready (each certified itself at start-up), one answer
streams through the group driver (``moe/group_client.py``) to the terminal, and `up`
serves the group until Ctrl-C or SIGTERM.

Then a front (``meshnet worker --expert-group ...``, ``moe/front.py``) registers the
group with the tracker as one full-range worker, and the gateway serves it like any route.

A group does not survive the loss of a node: a restarted node starts at step 0 without its
sessions' KV cache, while its peers continue. So the nodes and the front restart together, as
one supervisor group: a lost node fails the requests in flight with a structured error, and the
group re-forms (its nodes certify and load again) while the gateway answers "no route".

As for layer workers, every node gets a worker identity minted from the data dir's swarm CA and
the demo driver a gateway identity, so the group's links are mutual TLS; ``--insecure`` keeps
them plaintext.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from meshnet.core.errors import InvalidArgument
from meshnet.core.swarm_options import SecurityOptions
from meshnet.deploy.expert_launch import NodeIdentity, expert_group_specs, expert_node
from meshnet.deploy.launch.ready_lines import ExpertNodeLine
from meshnet.process.supervisor import Event, Supervised, Supervisor

if TYPE_CHECKING:  # deploy.up imports this module at run time; the engine only when `up` runs
    from meshnet.artifact.describe import ModelDescription
    from meshnet.deploy.config import LocalSwarmConfig
    from meshnet.engine.tokenizer import Tokenizer
    from meshnet.security.identity import Role
    from meshnet.wire.tls import LinkSecurity

DRIVER_IDENTITY = "expert-driver"
"""The demo driver's identity folder in ``DATA_DIR/swarm/nodes`` (a gateway certificate)."""


@dataclass(frozen=True)
class DemoResult:
    """What the demo printed: the sampled token ids, the decoded text, and a crc32 over the bits
    of every logit the sampler saw (so a test can compare the group with the whole model bitwise)."""

    tokens: tuple[int, ...]
    text: str
    logits_crc32: int
    seconds: float


def start_expert_group(
    config: LocalSwarmConfig, supervisor: Supervisor, group: str | None = None, tracker: str | None = None
) -> list[str]:
    """Start the N nodes at once, wait for every ready line; returns their addresses in index order.
    ``group``: the supervisor group they restart in, together (a group cannot take one node back)."""
    from meshnet.moe.shape import read_moe_shape  # parsing the GGUF header: only when `up` runs

    shape = read_moe_shape(config.model)  # refuses a model without routed experts, with a typed error
    if config.expert_parallel > shape.n_expert:
        raise InvalidArgument(
            f"--expert-parallel {config.expert_parallel} exceeds the model's {shape.n_expert} routed experts"
        )
    if config.expert_cache_mb is not None and config.expert_cache_mb <= 0:
        raise InvalidArgument(f"--expert-cache-mb must be positive, not {config.expert_cache_mb}")
    node = replace(
        expert_node(config.data_dir, config.model, config.expert_parallel),
        threads=config.threads,
        model_name=config.model_name,
        expert_cache_mb=config.expert_cache_mb,
        repack=config.repack,  # the front has it too (deploy.up): the recipe names it
        # Revocation lists and renewal (moe/watch.py) come from the tracker; plaintext has neither.
        tracker=None if config.insecure else tracker,
    )
    identity = None if config.insecure else minted_worker_identity(config.data_dir)
    peers, specs = expert_group_specs(node, config.data_dir / "logs", identity=identity)
    supervisor.start([Supervised(spec, group=group) for spec in specs])
    return peers


def minted_security(data_dir: Path, name: str, role: Role) -> LinkSecurity:
    """An identity named ``name`` with ``role``, minted from ``data_dir``'s swarm CA (created on
    first use) as ``meshnet up`` mints its components' (tests and benches of groups use it too)."""
    from meshnet.security.swarm_dir import load_identity, local_identity
    from meshnet.wire.tls import LinkSecurity  # the CA code: only when a group starts

    folder = local_identity(data_dir, name, role, time.time())
    return LinkSecurity(load_identity(folder), store=folder)


def minted_worker_identity(data_dir: Path) -> Callable[[str], NodeIdentity]:
    """Each node's identity: ``--identity`` of a worker certificate minted from ``data_dir``'s CA."""

    def mint(name: str) -> NodeIdentity:
        security = minted_security(data_dir, name, "worker")
        return NodeIdentity(SecurityOptions(identity=security.store), security.identity.node_id)

    return mint


def driver_security(config: LocalSwarmConfig) -> LinkSecurity | None:
    """The demo driver's identity: a gateway certificate, as the parties that drive generation hold."""
    return None if config.insecure else minted_security(config.data_dir, DRIVER_IDENTITY, "gateway")


def describe_node(component: Supervised, event: Event) -> str:
    """One terminal line per node event (the ready line names its address and experts)."""
    if event != "started":
        return f"{component.name} {event}"
    node = ExpertNodeLine.read(component.ready)
    return f"expert    {node.address}  experts {node.experts}  certified {node.certified}"


def demo_prompt(tokenizer: Tokenizer, source: ModelDescription, text: str) -> list[int]:
    """The user message through the model's chat template; a plain completion if it has none."""
    if isinstance(source.chat_template, str):
        return tokenizer.encode_chat([{"role": "user", "content": text}])
    return tokenizer.encode(text, add_special=True)


def run_demo(config: LocalSwarmConfig, peers: list[str]) -> DemoResult:
    """Stream one greedy answer through the group (default sampling is greedy); prints it as it arrives."""
    from meshnet.artifact.describe import describe_model
    from meshnet.core.generation import GenerationRequest, SamplingParams
    from meshnet.engine.local_route import LocalRoute
    from meshnet.engine.tokenizer import Tokenizer
    from meshnet.moe.group_client import ExpertGroupClient

    template = None if config.chat_template is None else config.chat_template.read_text()
    source = describe_model(config.model)
    source = replace(source, chat_template=template or source.chat_template)  # --chat-template, as the gateway
    tokenizer = Tokenizer(source)
    prompt = demo_prompt(tokenizer, source, config.prompt)
    request = GenerationRequest(tuple(prompt), config.max_tokens, SamplingParams(), tokenizer.eos_token_ids)
    print(f"\n> {config.prompt}\n")
    group = ExpertGroupClient(peers, security=driver_security(config))
    route = LocalRoute([group])
    decoder, tokens, pieces = tokenizer.new_decoder(), [], []
    digest = [0]

    def fold(logits: np.ndarray) -> None:
        digest[0] = zlib.crc32(np.ascontiguousarray(logits, np.float32).tobytes(), digest[0])

    started = time.perf_counter()
    try:
        for token in route.generate(request, on_logits=fold):
            tokens.append(token)
            if token not in tokenizer.eos_token_ids:
                pieces.append(decoder.push(token))
                print(pieces[-1], end="", flush=True)
        pieces.append(decoder.flush())
        nodes = group.describe()
    finally:
        route.close()
    elapsed = time.perf_counter() - started
    print(pieces[-1])
    print(
        f"[{len(tokens)} tokens in {elapsed:.2f} s through {len(peers)} expert nodes; "
        f"logits crc32 {digest[0]:08x}; ids {' '.join(map(str, tokens))}]"
    )
    for node in nodes:
        if node.expert_cache_bytes:
            lookups = node.expert_cache_hits + node.expert_cache_misses
            print(
                f"  node {node.index}: expert cache {node.expert_cache_bytes / 1e6:.1f} MB, "
                f"hit rate {node.expert_cache_hits / max(lookups, 1):.2f}, "
                f"{node.expert_cache_bytes_read / 1e6:.1f} MB read from the model file"
            )
    return DemoResult(tuple(tokens), "".join(pieces), digest[0], elapsed)
