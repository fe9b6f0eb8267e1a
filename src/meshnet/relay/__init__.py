"""The NAT seam: a relay that splices end-to-end TLS between a dialer and a private node.

A node behind a home router or carrier NAT cannot be dialled; it keeps one outbound,
authenticated, multiplexed link to a relay and is reached at ``NODE@RELAY_HOST:PORT``
(``core.addresses.RelayedAddress``). The relay only ever sees the inner TLS records.

- ``meshnet.relay.dial.dial``: the one opener of every grpc.aio channel (direct or relayed);
- ``meshnet.relay.attach.attach``: a private node's task that keeps it attached to a relay;
- ``meshnet.relay.serve.start_relay``: the relay server (``meshnet relay``),
  configured by ``meshnet.relay.config.RelayConfig``; ``meshnet.relay.load.fetch_load`` asks one
  for its load.

Nothing is imported here: the CLI reads ``RelayConfig`` to build its parser without grpc.
"""
