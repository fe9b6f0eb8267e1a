"""``meshnet swarm``'s options refuse what the action would silently ignore."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.swarm_options import SwarmArguments

STORE = "etcd://127.0.0.1:2379"


def test_store_is_taken_by_invite_only() -> None:
    assert SwarmArguments("invite", store=STORE).store == STORE
    for action in ("revoke", "init"):
        with pytest.raises(InvalidArgument, match="--store"):
            SwarmArguments(action, "node-1", store=STORE)  # type: ignore[arg-type]
