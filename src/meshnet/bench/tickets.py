"""Route tickets for the bench's ``meshnet-N`` lanes, which build their routes without a tracker.

Every shard refuses an opening frame without its route's ticket (``core.tickets``), so the bench
plays the tracker's part for its own lanes: on a secured lane it signs each session's ticket
with a tracker-role identity it mints from the data dir's swarm CA (a launcher beside the CA
could mint any certificate anyway, ``security.swarm_dir.local_identity``) and gives it to the
bench's client identity; on an ``--insecure`` lane tickets are unsigned, as an unsecured tracker
issues them. The lanes thus run the same checks a swarm's routes do.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, new_request_id, new_session_id
from meshnet.core.tickets import DEFAULT_TICKET_S
from meshnet.route.route_run import RouteSession
from meshnet.security.certificates import read_peer
from meshnet.security.swarm_dir import load_identity, local_identity
from meshnet.security.tickets import TicketSigner
from meshnet.wire.ticket_wire import issue_ticket
from meshnet.wire.tls import LinkSecurity

SIGNER_NAME = "bench-tickets"


class LaneTickets:
    """Issues the ticket of each bench session; ``client``: the bench's link identity (None:
    an insecure lane, unsigned tickets)."""

    def __init__(self, data_dir: Path, client: LinkSecurity | None) -> None:
        if client is None:
            self._signer: TicketSigner | None = None
            self._holder: NodeId | None = None
            return
        identity = load_identity(local_identity(data_dir, SIGNER_NAME, "tracker", time.time()))
        self._signer = TicketSigner(lambda: identity)
        node = client.node
        self._holder = NodeId(read_peer(node.cert_pem, node.ca_pem, time.time()).node_id)

    def session(self, hops: Sequence[RouteHop], fingerprint: str, *, epoch: int = 0) -> RouteSession:
        """A new session on ``hops`` (head first), with its ticket."""
        request_id, session_id = new_request_id(), new_session_id()
        ticket = issue_ticket(
            hops,
            session_id=session_id,
            request_id=request_id,
            epoch=epoch,
            fingerprint=fingerprint,
            holder=self._holder,
            now_unix_s=time.time(),
            seconds=DEFAULT_TICKET_S,
            signer=self._signer,
        )
        return RouteSession(request_id, session_id, tuple(hops), fingerprint, epoch, ticket)
