"""When a replica withdraws a ``nodes/<id>`` key from etcd (pure decisions of the exchange).

A node's key lets every replica take the node; withdrawing it too early strands a node that some
replica still hears, too late keeps routing to a node that is gone. The rules: a node that left
this replica is withdrawn as soon as no replica hears it; any other key no replica hears or
holds is withdrawn by any replica after ``STALE_KEY_WINDOWS`` expiry windows (its announcer
died, or withdrew nothing while cut off from etcd); a quarantined node keeps its key. Each
delete is conditional on the revision judged here (``tracker.etcd.membership`` carries them out),
so a node registered again meanwhile keeps its new key.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.ids import NodeId
from meshnet.tracker.etcd.membership_values import Outbound

STALE_KEY_WINDOWS = 2
"""Expiry windows a ``nodes/<id>`` key no replica hears is kept before any replica withdraws it
(its announcer died, or withdrew nothing while cut off from etcd)."""


@dataclass(frozen=True)
class Withdrawals:
    """What one exchange withdraws, and what it remembers of keys nobody hears."""

    deletes: tuple[tuple[NodeId, int], ...]
    """Keys to delete, each only if still at that mod_revision, in this order."""
    settled: frozenset[NodeId]
    """Departed nodes whose key is gone: withdrawn now, rewritten by another replica, or absent."""
    unheard: dict[NodeId, tuple[float, int]]
    """Keys no replica hears after this exchange: since when, at which mod_revision."""


def plan_withdrawals(
    outbound: Outbound,
    keys: dict[NodeId, int],
    heard: set[NodeId],
    unheard: dict[NodeId, tuple[float, int]],
    stale_after_s: float,
) -> Withdrawals:
    """The withdrawals of one exchange: ``keys`` is every ``nodes/<id>`` key by mod_revision,
    ``heard`` the nodes any replica heard, ``unheard`` what the previous exchange remembered,
    ``stale_after_s`` how long a key nobody hears is kept (``STALE_KEY_WINDOWS`` expiry windows)."""
    departed, settled = _departed_withdrawals(outbound, keys, heard)
    stale, still_unheard = _stale_withdrawals(outbound, keys, heard, unheard, stale_after_s)
    return Withdrawals((*departed, *stale), settled, still_unheard)


def _departed_withdrawals(
    outbound: Outbound, keys: dict[NodeId, int], heard: set[NodeId]
) -> tuple[list[tuple[NodeId, int]], frozenset[NodeId]]:
    """Nodes that left this replica: withdrawn at once unless another replica hears them (so it,
    or a new one, can still take them) or they are quarantined."""
    deletes, settled = [], set()
    for node_id, revision in outbound.departed.items():
        if keys.get(node_id) != revision:
            settled.add(node_id)  # rewritten by another replica (a new registration) or gone
        elif node_id not in heard and node_id not in outbound.quarantined:
            deletes.append((node_id, revision))
            settled.add(node_id)
    return deletes, frozenset(settled)


def _stale_withdrawals(
    outbound: Outbound,
    keys: dict[NodeId, int],
    heard: set[NodeId],
    unheard: dict[NodeId, tuple[float, int]],
    stale_after_s: float,
) -> tuple[list[tuple[NodeId, int]], dict[NodeId, tuple[float, int]]]:
    """Keys nobody hears or holds here: withdrawn once unchanged for ``stale_after_s``; a key
    rewritten meanwhile (a new registration) starts its wait again."""
    deletes, still_unheard = [], {}
    for node_id, revision in keys.items():
        if node_id in heard or node_id in outbound.known or node_id in outbound.quarantined:
            continue
        since, seen_revision = unheard.get(node_id, (outbound.now, revision))
        if seen_revision != revision:
            still_unheard[node_id] = (outbound.now, revision)
        elif outbound.now - since > stale_after_s:
            deletes.append((node_id, revision))
        else:
            still_unheard[node_id] = (since, seen_revision)
    return deletes, still_unheard
