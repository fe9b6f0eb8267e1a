"""The worker's peer bounds: typed config values that reach the session table's admission."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.node.config import FakeModel, LayerChoice, WorkerConfig
from meshnet.session.admission import PeerBounds


def config(**fields: float) -> WorkerConfig:
    return WorkerConfig(
        model=None,
        layer_choice=LayerChoice(LayerRange(0, 6)),
        data_dir=Path("/nonexistent"),
        fake=FakeModel(),
        **fields,
    )


def test_the_defaults_leave_a_lone_opener_the_whole_shard_and_bound_it_at_half_under_pressure() -> None:
    policy = config().admission_policy(8)
    assert policy.peers == PeerBounds(share=0.5, min_token_rate=0.5, grace=60.0)
    assert policy.peers.bound(policy.max_sessions) == 4
    assert config(session_share=0.25, session_min_rate=2.0, session_grace=5.0).admission_policy(8).peers == PeerBounds(
        0.25, 2.0, 5.0
    )


@pytest.mark.parametrize(
    "fields", [{"session_share": 0.0}, {"session_share": 1.5}, {"session_min_rate": 0.0}, {"session_grace": -1.0}]
)
def test_bounds_that_mean_nothing_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument, match="--session-share"):
        config(**fields)
