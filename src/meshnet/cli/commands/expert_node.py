"""``meshnet worker --experts I/N``: what one node of an expert-parallel group reads of its flags.

The node takes the worker's flags (``WorkerConfig``, parsed by ``serve.worker_config``) and the
worker's identity; what it reads of them is its own typed config (``moe.config.ExpertNodeConfig``),
built here.
"""

from __future__ import annotations

from meshnet.core.errors import InvalidArgument
from meshnet.moe.config import ExpertNodeConfig, ExpertPeer
from meshnet.node.config import WorkerConfig


def expert_node_config(worker: WorkerConfig) -> ExpertNodeConfig:
    """What an expert node reads of its worker flags."""
    if worker.experts is None or worker.model is None:
        raise InvalidArgument("an expert node needs --experts I/N and --model")
    cache_mb = worker.expert_cache_mb
    return ExpertNodeConfig(
        ownership=worker.experts,
        peers=tuple(ExpertPeer.parse(entry) for entry in worker.expert_peers),
        model=worker.model,
        data_dir=worker.data_dir,
        llama=worker.llama_config(worker.max_sessions),
        host=worker.host,
        port=worker.port,
        tracker=worker.tracker,
        exchange_timeout_s=worker.expert_timeout,
        expert_cache_bytes=None if cache_mb is None else int(cache_mb * 1e6),
    )
