"""An expert node's description on the wire, and the front's verdict on the numerics it reports."""

from __future__ import annotations

import pytest

from meshnet.moe import wire as expert_wire
from meshnet.moe.ownership import ExpertNumerics, numerics_mismatch

BASE = dict(
    index=1,
    group_size=2,
    model_sha256="ab" * 32,
    n_vocab=300,
    n_expert=64,
    n_expert_used=8,
    max_sessions=2,
    context=512,
    peers_connected=1,
    n_layers=2,
    n_embd=64,
    exchanges=7,
    exchange_p50_us=12.5,
    next_step=9,
)


@pytest.mark.parametrize("numerics", [ExpertNumerics(256, True, True), ExpertNumerics(128, False, False), None])
def test_a_description_round_trips_with_or_without_numerics(numerics: ExpertNumerics | None) -> None:
    info = expert_wire.ExpertNodeDescription(**BASE, numerics=numerics)  # type: ignore[arg-type]
    message = expert_wire.node_info_to_proto(info)
    assert message.HasField("numerics") == (numerics is not None)  # absent, not zeros: an older node
    assert expert_wire.node_info_from_proto(expert_wire.ExpertNodeInfo.FromString(message.SerializeToString())) == info


def test_a_front_must_compute_with_its_nodes_settings() -> None:
    own = ExpertNumerics(256, True, True)
    assert numerics_mismatch(own, [(0, own), (1, ExpertNumerics(256, True, True))]) is None
    assert numerics_mismatch(own, [(0, None), (1, own)]) is None  # not reported: nothing to compare
    why = numerics_mismatch(own, [(0, own), (1, ExpertNumerics(256, False, True))])
    assert why is not None
    assert why.startswith("expert node 1 computes with --prefill-chunk 256 --no-flash-attn --repack")
    assert "this front was started with --prefill-chunk 256 --flash-attn --repack" in why
    assert numerics_mismatch(own, [(0, ExpertNumerics(64, True, True))]) is not None
    assert numerics_mismatch(own, [(0, ExpertNumerics(256, True, False))]) is not None
