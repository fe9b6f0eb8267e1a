"""The tracker's dial-back deadline (``tracker.dial_back``): through a relay it outlasts the
relay's own waits, so a slow but live relayed node is not registered private by a race."""

from __future__ import annotations

from meshnet.relay.dial import DIAL_ACCEPT_TIMEOUT_S
from meshnet.relay.server import SPLICE_TIMEOUT_S
from meshnet.tracker.dial_back import DIAL_BACK_TIMEOUT_S, AddressProof


def test_a_relayed_dial_back_waits_out_the_relay_then_the_usual_handshake_and_call() -> None:
    proof = AddressProof(None)
    assert proof.timeout_s("10.0.0.5:7000") == DIAL_BACK_TIMEOUT_S
    relayed = proof.timeout_s("w-home@10.0.0.9:7400")
    assert relayed >= max(SPLICE_TIMEOUT_S, DIAL_ACCEPT_TIMEOUT_S) + DIAL_BACK_TIMEOUT_S
