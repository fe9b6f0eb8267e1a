"""The NAT seam: a relay that splices end-to-end TLS between a dialer and a private node.

A node behind a home router or carrier NAT cannot be dialled; it keeps one outbound,
authenticated, multiplexed link to a relay and is reached at ``NODE@RELAY_HOST:PORT``
(``core.addresses.RelayedAddress``). The relay only ever sees the inner TLS records.
"""
