"""Where a node is dialled now: its own address, or ``NODE@RELAY`` while a relay carries it.

A worker behind NAT (``--reachability private``, or ``auto`` once the tracker answered that its
address does not answer) attaches to one of its ``--relay``s (``meshnet.relay.attach``), which
reports the relayed address it is reached at, or None while no relay carries it. The heartbeat
loop (``membership.heartbeats``) registers whatever this says and registers again at once when
it changes, so a node that moved to another relay is routed there within one registration, not
one heartbeat interval later; while no relay carries it, it registers its own address declared
private (listed, not routed).
"""

from __future__ import annotations

import asyncio

from meshnet.core.reachability import DeclaredReachability, Reachability, wants_relay


class Reach:
    """One node's current address and what it declares; call from one event loop."""

    def __init__(self, direct: str, declared: DeclaredReachability = "auto", relays: tuple[str, ...] = ()) -> None:
        self.direct = direct
        self.declared: DeclaredReachability = declared
        self.relays = relays
        self.relayed: str | None = None
        """``NODE@RELAY`` while a relay carries this node."""
        self.changed = asyncio.Event()
        """Set when the address moved: the heartbeat loop registers again at once."""
        self._found_private = False

    @property
    def address(self) -> str:
        return self.relayed or self.direct

    @property
    def declaring(self) -> DeclaredReachability:
        """``private`` once this node knows it is behind NAT: its own address is not dialled again."""
        return "private" if self._found_private else self.declared

    @property
    def wants_relay(self) -> bool:
        """Attach to a relay: it has some and is private by its word or by the tracker's."""
        return bool(self.relays) and wants_relay(self.declared, "private" if self._found_private else None)

    def registered(self, reachability: Reachability) -> None:
        """What the tracker registered this node as: ``private`` at its own address is learnt for good."""
        if reachability == "private" and self.relayed is None:
            self._found_private = True

    def moved(self, relayed: str | None) -> None:
        """The relay attachment's report (``meshnet.relay.attach``'s ``on_address``)."""
        if relayed != self.relayed:
            self.relayed = relayed
            self.changed.set()
