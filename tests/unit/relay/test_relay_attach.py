"""relay.attach: the address a relay announces is registered only if it names this very node."""

from __future__ import annotations

import pytest

from meshnet.core.errors import Unavailable
from meshnet.core.ids import NodeId
from meshnet.relay.attach import _announced
from meshnet.relay.config import DEFAULT_RELAY_PORT

NODE = NodeId("w-abc123")
RELAY = f"203.0.113.7:{DEFAULT_RELAY_PORT}"


def test_an_address_naming_this_node_through_the_relay_is_taken() -> None:
    assert _announced(RELAY, NODE, f"w-abc123@{RELAY}") == f"w-abc123@{RELAY}"


@pytest.mark.parametrize(
    "announced",
    [
        f"w-other1@{RELAY}",  # another node's address: this node would register someone else
        RELAY,  # a direct address: not reached through the relay at all
        "w-abc123@not an address",
        "",
    ],
)
def test_anything_else_is_refused(announced: str) -> None:
    with pytest.raises(Unavailable):
        _announced(RELAY, NODE, announced)


def test_a_refusal_instead_of_an_address_is_refused() -> None:
    with pytest.raises(Unavailable, match="did not accept"):
        _announced(RELAY, NODE, None)
