"""What `meshnet generate` and `meshnet up` print about long work: split speeds, a progress line."""

from __future__ import annotations

from meshnet.cli.commands.models import speed_line
from meshnet.deploy.up_demo import describe_event as _describe


def test_generate_reports_prefill_and_decode_speed_apart() -> None:
    assert speed_line(100, 11, 0.5, 2.0) == (
        "[prefill 100 tokens in 0.50 s (200.0 tok/s); decode 10 tokens in 2.00 s (5.0 tok/s)]"
    )
    assert speed_line(3, 1, 0.1, 0.0).endswith("decode 0 tokens in 0.00 s (- tok/s)]")


def test_up_describes_prefill_and_replay_progress() -> None:
    prefill = {"kind": "prefill_progress", "done_tokens": 64, "total_tokens": 1700, "eta_seconds": 12.25}
    assert _describe(prefill) == "prefill 64/1700 tokens, ETA 12.2 s"
    replay = {**prefill, "replay": True, "eta_seconds": None}
    assert _describe(replay) == "replay 64/1700 tokens"
