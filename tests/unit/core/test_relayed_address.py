"""The relayed address format: ``NODE@RELAY_HOST:PORT`` parses back to what was written."""

from __future__ import annotations

import pytest

from meshnet.core.addresses import RelayedAddress, is_relayed, parse_relayed
from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId


def test_round_trip() -> None:
    address = RelayedAddress(NodeId("w-0a1b2c3d4e5f"), "10.0.0.5:7300")
    assert str(address) == "w-0a1b2c3d4e5f@10.0.0.5:7300"
    assert parse_relayed(str(address)) == address
    assert parse_relayed("w-0a1b2c3d4e5f@[fd00::5]:7300") == RelayedAddress(NodeId("w-0a1b2c3d4e5f"), "[fd00::5]:7300")


def test_direct_addresses_are_not_relayed() -> None:
    assert parse_relayed("10.0.0.5:7000") is None
    assert not is_relayed("localhost:7000")
    assert is_relayed("w-1@relay.example:7300")


@pytest.mark.parametrize(
    "bad", ["@10.0.0.5:7300", "W-UPPER@10.0.0.5:7300", "w-1@", "w-1@10.0.0.5", "w-1@0.0.0.0:7300", "w-1@h:0"]
)
def test_malformed_relayed_addresses_are_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="NODE_ID@RELAY_HOST:PORT"):
        parse_relayed(bad)
