"""Whether others can dial a node: public, through a relay, or not at all (behind NAT).

A node says what it knows (``--reachability``: ``auto``, ``public`` or ``private``); the tracker
decides what it registers from that, the address and whether the node answered there when the
tracker dialled it back (``tracker.dial_back``). A ``private`` node stays registered (it shows in
status and heartbeats) but is never routed and evicts nobody: nobody can dial its address. A
node behind NAT with a relay registers ``NODE@RELAY`` and, once it answered through the relay,
is ``relayed``: routable, its seams costed by the round trips measured through the relay.

Every decision here is a pure function, shared by the tracker (what to register) and the worker
(whether to attach to a relay).
"""

from __future__ import annotations

from typing import Literal, TypeVar

from meshnet.core.addresses import is_relayed, parse_relayed
from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId

Reachability = Literal["public", "relayed", "private"]
"""What the tracker registered: dialled directly, dialled through a relay, or not dialable."""
REACHABILITIES: tuple[Reachability, ...] = ("public", "relayed", "private")
_Word = TypeVar("_Word", bound=str)
DeclaredReachability = Literal["auto", "public", "private"]
"""What a node says of itself (``--reachability``): ``auto`` lets the tracker's dial-back decide."""
DECLARED_REACHABILITIES: tuple[DeclaredReachability, ...] = ("auto", "public", "private")
PRIVATE_WORDS = "private: behind NAT, no relay attached"
"""How status names an unroutable private node."""


def check_declared(value: str) -> DeclaredReachability:
    """``value`` as a declared reachability (empty means ``auto``: an older node says nothing)."""
    return _one_of(value, DECLARED_REACHABILITIES, empty="auto")


def check_reachability(value: str) -> Reachability:
    """``value`` as a registered reachability (empty means ``public``: an older tracker's node)."""
    return _one_of(value, REACHABILITIES, empty="public")


def _one_of(value: str, choices: tuple[_Word, ...], *, empty: _Word) -> _Word:
    """``value`` as one of ``choices`` (the typed word itself), ``empty`` for an unset field."""
    if value == "":
        return empty
    for choice in choices:
        if value == choice:
            return choice
    raise InvalidArgument(f"reachability must be one of {', '.join(choices)}, got {value!r:.40}")


def check_relayed_owner(address: str, node_id: NodeId) -> None:
    """Refuse a relayed address that names another node: ``NODE@RELAY`` is only NODE's to register."""
    relayed = parse_relayed(address)
    if relayed is not None and relayed.node_id != node_id:
        raise InvalidArgument(
            f"node {node_id} registers the relayed address {address}, which names node {relayed.node_id}: "
            "a node registers only its own NODE_ID@RELAY_HOST:PORT"
        )


def needs_dial_back(address: str, declared: DeclaredReachability) -> bool:
    """False when the node says its direct address is private: nothing to prove, nobody dials it."""
    return declared != "private" or is_relayed(address)


def registered_reachability(address: str, declared: DeclaredReachability, answered: bool | None) -> Reachability:
    """What the tracker registers a node as.

    ``answered``: whether the node answered at ``address`` under its own certificate when the
    tracker dialled it back; None when nothing was checked (an unsecured tracker proves nothing,
    so it takes the node's word). A direct address declared private is private whatever it is:
    the node knows better than a dial-back from the tracker's own network."""
    relayed = is_relayed(address)
    if answered is False or (declared == "private" and not relayed):
        return "private"
    return "relayed" if relayed else "public"


def is_routable(reachability: Reachability) -> bool:
    """Only a node someone can dial is routed (or probed, or takes an address from another node)."""
    return reachability != "private"


def wants_relay(declared: DeclaredReachability, told: Reachability | None) -> bool:
    """Whether a node with relays configured should attach to one: it said it is private, or
    (``auto``) the tracker answered that its direct address does not answer."""
    if declared == "private":
        return True
    return declared == "auto" and told == "private"


def describe(reachability: Reachability, address: str) -> str:
    """Status words: ``public``, ``relayed via HOST:PORT``, or the private sentence."""
    if reachability == "private":
        return PRIVATE_WORDS
    relayed = parse_relayed(address)
    if reachability == "relayed" and relayed is not None:
        return f"relayed via {relayed.relay}"
    return reachability
