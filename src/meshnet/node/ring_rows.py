"""Who may send a session's ring batch rows: the one decision ``ShardServicer.RingBatch`` makes
per row before it hands the row to its session's stream.

A batch stream carries the rows of many sessions from one sender, so a row's session must be
checked against that sender: a session takes rows only from the peer that opened it here (its
upstream, whose certificate the opening frame's route ticket named). A row that fails the check
is refused alone; it must neither reach nor harm the session it names, which belongs to someone
else (a stray or hostile sender must not be able to end other parties' sessions), or to a later
opening of the same session id (a late row of the route epoch before it).
"""

from __future__ import annotations


def row_refusal(
    held: bool, sender: str | None, opener: str | None, *, epoch: int, session_epoch: int | None
) -> str | None:
    """Why a row from ``sender`` may not go to the session it names (None: it may).

    ``held``: the session is open here (its stream takes rows); ``opener``: the node id that
    opened it; both ids are None on an unsecured worker, where nobody is checked. ``epoch``: the
    row's route epoch; ``session_epoch``: the one the session here was opened on.

    A row of another route epoch is a late row of an earlier opening of the session id (the
    session was opened again by a failover's newer route, and this row was still on its way on
    the batch stream when the new opening frame arrived on its own stream). Handed to the
    session, it would end it (``RouteStale``); refused, it reaches only the leg that sent it."""
    if not held:
        return "no such session here (never opened, ended, or failed)"
    if sender != opener:
        return "this session was opened by another peer; only its upstream sends its rows"
    if epoch != session_epoch:
        return f"the row is of route epoch {epoch}; the session here was opened on epoch {session_epoch}"
    return None
