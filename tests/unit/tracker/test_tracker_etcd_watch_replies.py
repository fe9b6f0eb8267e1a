"""How the etcd client reads a watch stream's replies (``tracker.etcd.client``): a reply that
ends the watch (cancelled, or compacted past) is no proof of progress. The replies are written
here as etcd's JSON gateway sends them (int64 as strings, zero values left out): a real etcd
sends a cancel only for a watch started at a compacted revision, which the client never asks for."""

from __future__ import annotations

from typing import Any

import pytest

from meshnet.tracker.etcd.client import ends_watch, progress_revision

HEADER = {"cluster_id": "1", "member_id": "2", "revision": "41", "raft_term": "3"}


@pytest.mark.parametrize(
    ("reply", "progress", "ended"),
    [
        ({"header": HEADER}, 41, False),  # a progress notification: nothing but the header
        ({"header": HEADER, "created": True}, None, False),
        ({"header": HEADER, "events": [{"kv": {"key": "a2V5", "value": "MQ=="}}]}, None, False),
        ({"header": HEADER, "canceled": True, "cancel_reason": "mvcc: required revision is compacted"}, None, True),
        ({"header": HEADER, "compact_revision": "17"}, None, True),
        ({"header": HEADER, "canceled": True, "compact_revision": "17"}, None, True),
    ],
)
def test_only_a_live_watchs_bare_reply_is_progress(reply: dict[str, Any], progress: int | None, ended: bool) -> None:
    assert progress_revision(reply) == progress
    assert ends_watch(reply) is ended
