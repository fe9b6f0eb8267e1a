"""Who may send a session's ring batch rows: the one decision ``ShardServicer.RingBatch`` makes
per row before it hands the row to its session's stream.

A batch stream carries the rows of many sessions from one sender, so a row's session must be
checked against that sender: a session takes rows only from the peer that opened it here (its
upstream, whose certificate the opening frame's route ticket named). A row that fails the check
is refused alone; it must neither reach nor harm the session it names, which belongs to someone
else (a stray or hostile sender must not be able to end other parties' sessions).
"""

from __future__ import annotations


def row_refusal(held: bool, sender: str | None, opener: str | None) -> str | None:
    """Why a row from ``sender`` may not go to the session it names (None: it may).

    ``held``: the session is open here (its stream takes rows); ``opener``: the node id that
    opened it; both ids are None on an unsecured worker, where nobody is checked."""
    if not held:
        return "no such session here (never opened, ended, or failed)"
    if sender != opener:
        return "this session was opened by another peer; only its upstream sends its rows"
    return None
