"""The command line that starts each component, rendered from its typed config.

`meshnet up`, the lab, the bench and the test harnesses start trackers, workers, expert nodes,
gateways and seeders as ``python -m meshnet ...`` processes. Each argv is written from the
component's own config dataclass by ``core.config_flags.render_arguments``, the inverse of the
parser the CLI builds from the same fields: a flag's name is written once, only what differs
from a default travels, and a launcher says what it wants as a typed value.

The swarm identity a process runs with is a ``SecurityOptions`` beside its config, as on the
command line: ``minted_identity`` mints one from a data dir's CA (as ``meshnet up`` does for its
components), ``INSECURE`` is plaintext on loopback.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from meshnet.core.config_flags import render_arguments
from meshnet.core.swarm_options import SecurityOptions
from meshnet.process.launcher import meshnet_command

if TYPE_CHECKING:  # only their fields are read: starting a launcher loads none of the components
    from meshnet.gateway.config import GatewayProcessConfig
    from meshnet.node.artifact_server import SeedConfig
    from meshnet.node.config import WorkerConfig
    from meshnet.relay.config import RelayConfig
    from meshnet.security.identity import Role
    from meshnet.tracker.config import TrackerConfig

TRACKER_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
"""What every launcher adds to a tracker's environment. The tracker imports numpy (``core.prefix``
through ``core.tracking``, ``tracker.speeds``, and the CLI's parser) but never calls BLAS, and
importing numpy starts an OpenBLAS pool of one thread per core (measured: a second thread on a
2-core machine, none with these set). Not importing numpy there would mean moving ``core``'s
prefix hashing out of the types the tracker shares with the workers."""

INSECURE = SecurityOptions(insecure=True)
"""Plaintext, unauthenticated gRPC: loopback development and tests that are not about security."""


def minted_identity(data_dir: Path, name: str, role: Role) -> SecurityOptions:
    """``--identity`` of a certificate named ``name`` with ``role``, minted from ``data_dir``'s
    swarm CA (created on first use)."""
    from meshnet.security.swarm_dir import local_identity  # the CA code: only when one is minted

    return SecurityOptions(identity=local_identity(data_dir, name, role, time.time()))


@dataclass(frozen=True)
class TrackerLaunch:
    """How a tracker is started: its argv and what it adds to the environment it inherits. One
    value, so no launcher starts the argv without the environment."""

    argv: tuple[str, ...]
    environment: Mapping[str, str]


def tracker_launch(config: TrackerConfig, data_dir: Path) -> TrackerLaunch:
    """``meshnet tracker`` on ``data_dir`` (its database there unless ``config.db_path`` says
    otherwise), with ``TRACKER_ENVIRONMENT``: every launcher of a tracker starts it from this."""
    argv = meshnet_command(data_dir, "tracker", *render_arguments(config))
    return TrackerLaunch(argv, dict(TRACKER_ENVIRONMENT))


def worker_command(config: WorkerConfig, security: SecurityOptions) -> tuple[str, ...]:
    """``meshnet worker`` with ``config`` (its ``data_dir`` as the global ``--data-dir``).

    An expert node (``experts``) and a group's front (``expert_group``) serve the whole model:
    the CLI derives their layers from the model, and refuses ``--layers`` beside ``--experts``."""
    whole_model = config.experts is not None or bool(config.expert_group)
    skip = ("data_dir", "layer_choice") if whole_model else ("data_dir",)
    arguments = (*render_arguments(config, skip=skip), *render_arguments(security))
    return meshnet_command(config.data_dir, "worker", *arguments)


def gateway_command(config: GatewayProcessConfig, security: SecurityOptions) -> tuple[str, ...]:
    """``meshnet gateway`` with ``config`` (its ``data_dir`` as the global ``--data-dir``)."""
    arguments = (*render_arguments(config, skip=("data_dir",)), *render_arguments(security))
    return meshnet_command(config.data_dir, "gateway", *arguments)


def seed_command(config: SeedConfig, data_dir: Path, security: SecurityOptions) -> tuple[str, ...]:
    """``meshnet seed`` serving ``config.directory``."""
    return meshnet_command(data_dir, "seed", *render_arguments(config), *render_arguments(security))


def relay_command(config: RelayConfig, data_dir: Path, security: SecurityOptions) -> tuple[str, ...]:
    """``meshnet relay`` with ``config`` (an identity of role ``relay``, or ``INSECURE``)."""
    return meshnet_command(data_dir, "relay", *render_arguments(config), *render_arguments(security))
