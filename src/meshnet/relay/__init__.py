"""The NAT seam: a relay that splices end-to-end TLS between a dialer and a private node.

A node behind a home router or carrier NAT cannot be dialled; it keeps one outbound,
authenticated, multiplexed link to a relay and is reached at ``NODE@RELAY_HOST:PORT``
(``core.addresses.RelayedAddress``). The relay only ever sees the inner TLS records.

- ``dial``: the one opener of every grpc.aio channel (direct or relayed);
- ``attach``: a private node's task that keeps it attached to one relay of a list;
- ``start_relay`` / ``serve_relay``: the relay server (``meshnet relay``).
"""

from meshnet.relay.attach import attach
from meshnet.relay.config import RelayConfig
from meshnet.relay.dial import dial
from meshnet.relay.serve import RunningRelay, serve_relay, start_relay

__all__ = ["RelayConfig", "RunningRelay", "attach", "dial", "serve_relay", "start_relay"]
