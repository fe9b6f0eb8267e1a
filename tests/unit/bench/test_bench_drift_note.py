"""The drift note counts the distinct token ids a lane generated: perfect agreement over a
degenerate model (one token repeated) must not read like agreement over varied output."""

from __future__ import annotations

from meshnet.bench.config import LaneName
from meshnet.bench.runner import LaneState, lane_result
from meshnet.bench.stats import RequestTrace, RunRecord


def _lane(name: LaneName, streams: list[tuple[int, ...]]) -> LaneState:
    traces = tuple(
        RequestTrace(index, 4, 0.0, tuple(1.0 + step for step in range(len(tokens))), tokens, 9.0)
        for index, tokens in enumerate(streams)
    )
    return LaneState(name, runs={1: [RunRecord(1, 0.0, 9.0, traces)]})


def test_a_repeated_token_shows_in_the_drift_note() -> None:
    stuck = [(7,) * 16, (7,) * 16]
    reference = _lane(LaneName("llama-whole", 1), stuck)
    result = lane_result(_lane(LaneName("meshnet", 3), stuck), reference, {0: stuck[0], 1: stuck[1]})
    assert result.drift.token_agreement == 1.0
    assert result.drift.note.endswith("; 1 distinct token ids among 32 generated")


def test_varied_output_counts_each_id_once() -> None:
    streams = [(1, 2, 3, 2), (4, 1, 5, 6)]  # ids 1-6: six distinct among eight
    lane = _lane(LaneName("llama-whole", 1), streams)
    result = lane_result(lane, lane, {0: streams[0], 1: streams[1]})
    assert result.drift.note.endswith("; 6 distinct token ids among 8 generated")
