"""Where a node is dialled now: its own address, or ``NODE@RELAY`` while a relay carries it.

A worker behind NAT (``--reachability private``, or ``auto`` once the tracker answered that its
address does not answer) attaches to one of its ``--relay``s (``meshnet.relay.attach``), which
reports the relayed address it is reached at, or None while no relay carries it. The heartbeat
loop (``membership.heartbeats``) registers whatever this says and registers again at once when
it changes, so a node that moved to another relay is routed there within one registration, not
one heartbeat interval later; while no relay carries it, it registers its own address declared
private (listed, not routed).

A private verdict the node did not declare is a dial-back that failed: maybe NAT, maybe a slow
tracker or relay (one timeout). It is learnt for good ("stop offering the direct address, attach
to a relay") only when the node has relays to attach to; otherwise (and at a relayed address,
where the relay or the splice was slow) the node registers again after a jittered, bounded
backoff (``PrivateRetry``) until a dial-back succeeds, so one slow dial-back never takes a
reachable worker out of routes until it restarts.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from meshnet.core.reachability import DeclaredReachability, Reachability, needs_dial_back, wants_relay


@dataclass(frozen=True)
class PrivateRetry:
    """When a node registered private against its word registers again: the n-th such verdict in
    a row waits ``first_s * 2**(n-1)``, at most ``max_s``, drawn between half and all of it
    (nodes of one network failing together do not come back in step)."""

    first_s: float = 1.0
    max_s: float = 30.0

    def wait_s(self, verdicts: int, draw: Callable[[], float] = random.random) -> float:
        full = min(self.first_s * 2.0 ** max(verdicts - 1, 0), self.max_s)
        return full * (0.5 + 0.5 * draw())


class Reach:
    """One node's current address and what it declares; call from one event loop."""

    def __init__(
        self,
        direct: str,
        declared: DeclaredReachability = "auto",
        relays: tuple[str, ...] = (),
        retry: PrivateRetry = PrivateRetry(),
    ) -> None:
        self.direct = direct
        self.declared: DeclaredReachability = declared
        self.relays = relays
        self.relayed: str | None = None
        """``NODE@RELAY`` while a relay carries this node."""
        self.changed = asyncio.Event()
        """Set when the address moved: the heartbeat loop registers again at once."""
        self._found_private = False
        self._retry = retry
        self._unproven = 0
        """Private verdicts in a row that this node did not declare (failed dial-backs)."""
        self._again: asyncio.TimerHandle | None = None
        self._registered_as: Reachability | None = None
        """What the tracker registered this node as at its current address; None until it says."""

    @property
    def address(self) -> str:
        return self.relayed or self.direct

    @property
    def dialable(self) -> str | None:
        """Where peers can dial this node now (what it announces as an artifact holder): None
        while the tracker registered it private, or while it is private by its word or by an
        earlier verdict and no relay carries it."""
        if self._registered_as == "private":
            return None
        if self._registered_as is None and self.relayed is None and self.declaring == "private":
            return None
        return self.address

    @property
    def declaring(self) -> DeclaredReachability:
        """``private`` once this node knows it is behind NAT: its own address is not dialled again."""
        return "private" if self._found_private else self.declared

    @property
    def wants_relay(self) -> bool:
        """Attach to a relay: it has some and is private by its word or by the tracker's."""
        return bool(self.relays) and wants_relay(self.declared, "private" if self._found_private else None)

    def registered(self, reachability: Reachability) -> None:
        """What the tracker registered this node as. ``private`` at its own address is learnt for
        good when a relay can carry it instead; an unexpected ``private`` otherwise registers
        again after ``retry``'s wait (by setting ``changed``)."""
        self._cancel_retry()
        self._registered_as = reachability
        if reachability != "private":
            self._unproven = 0
            return
        if self.relayed is None and self.relays and self.declared == "auto":
            self._found_private = True
        if not needs_dial_back(self.address, self.declaring):
            return  # private by its own word: nothing to prove until a relay carries it
        self._unproven += 1
        self._again = asyncio.get_running_loop().call_later(self._retry.wait_s(self._unproven), self.changed.set)

    def close(self) -> None:
        """Stop the pending registration retry, if any."""
        self._cancel_retry()

    def _cancel_retry(self) -> None:
        if self._again is not None:
            self._again.cancel()
            self._again = None

    def moved(self, relayed: str | None) -> None:
        """The relay attachment's report (``meshnet.relay.attach``'s ``on_address``)."""
        if relayed != self.relayed:
            self.relayed = relayed
            self._registered_as = None  # not registered there yet
            self.changed.set()
