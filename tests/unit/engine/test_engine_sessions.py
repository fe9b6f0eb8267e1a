"""Sessions as llama sequences: a released slot is as good as new, sessions batched together
compute exactly what each computes alone, and truncate-and-replay reproduces a session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from engine_routes import batched_step, greedy, open_routes, prompt, release_all, slot_lengths

from meshnet.artifact.cache import SliceCache
from meshnet.core.layers import LayerRange
from meshnet.engine.bitwise import bit_identical, describe_difference
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute

SESSION_PROMPTS = [prompt(9, 10), prompt(45, 11), prompt(3, 12)]
DECODE_STEPS = 10


@pytest.fixture(scope="module")
def routes(
    tiny_model: Path, small_llama_config: LlamaConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LocalRoute]]:
    layouts = {"whole": [LayerRange(0, 4)], "split": [LayerRange(0, 2), LayerRange(2, 3), LayerRange(3, 4)]}
    with open_routes(
        tiny_model, SliceCache(tmp_path_factory.mktemp("sessions")), small_llama_config, layouts
    ) as opened:
        yield opened


@pytest.fixture(autouse=True)
def _free_slots(routes: dict[str, LocalRoute], small_llama_config: LlamaConfig) -> Iterator[None]:
    yield
    release_all(routes, small_llama_config.max_slots)


@pytest.mark.parametrize("layout", ["whole", "split"])
def test_release_then_reuse_gives_identical_results(routes: dict[str, LocalRoute], layout: str) -> None:
    route = routes[layout]
    first = route.forward(0, 0, SESSION_PROMPTS[1], "all")
    route.release(0)
    assert slot_lengths(route, 0) == [0] * len(route.backends)
    other = route.forward(0, 0, SESSION_PROMPTS[0], "all")  # someone else uses the slot
    assert not np.array_equal(other[-1], first[-1])
    route.release(0)
    again = route.forward(0, 0, SESSION_PROMPTS[1], "all")
    assert bit_identical(again, first)
    route.release(0)
    # and the generate() path, which releases by itself
    run = greedy(route, SESSION_PROMPTS[2], 12, slot=0)
    assert slot_lengths(route, 0) == [0] * len(route.backends)
    assert greedy(route, SESSION_PROMPTS[2], 12, slot=0).tokens == run.tokens


def _solo_reference(route: LocalRoute, slot: int) -> list[np.ndarray]:
    """Prefill's last row, then DECODE_STEPS greedy steps, one session alone; slot freed."""
    tokens = SESSION_PROMPTS[slot]
    rows = [route.forward(slot, 0, tokens, "last")[-1]]
    for step in range(DECODE_STEPS):
        token = np.array([int(np.argmax(rows[-1]))], np.int32)
        rows.append(route.forward(slot, len(tokens) + step, token, "last")[-1])
    route.release(slot)
    return rows


@pytest.mark.parametrize("layout", ["whole", "split"])
def test_batched_decode_of_three_sessions_equals_each_alone(routes: dict[str, LocalRoute], layout: str) -> None:
    route = routes[layout]
    solo = {slot: _solo_reference(route, slot) for slot in range(3)}
    # Batched: all three prefills in one run() call, then every decode step in one call.
    prefill = batched_step(route, [(slot, 0, SESSION_PROMPTS[slot]) for slot in range(3)])
    rows = {slot: [prefill[slot][-1]] for slot in range(3)}
    for step in range(DECODE_STEPS):
        steps = [
            (slot, len(SESSION_PROMPTS[slot]) + step, np.array([int(np.argmax(rows[slot][-1]))], np.int32))
            for slot in (2, 0, 1)  # out of slot order on purpose
        ]
        for slot, logits in batched_step(route, steps).items():
            rows[slot].append(logits[-1])
    for slot in range(3):
        batched, alone = np.stack(rows[slot]), np.stack(solo[slot])
        assert bit_identical(batched, alone), f"session {slot}: batched {describe_difference(alone, batched)}"
    assert not np.array_equal(rows[0][-1], rows[1][-1])


def test_a_small_batch_run_one_row_per_call_equals_it_run_as_one_call(
    routes: dict[str, LocalRoute],
    tiny_model: Path,
    small_llama_config: LlamaConfig,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Served on one thread where the CPU charges less for it (engine.call_costs; here set, not
    # measured), a batch of under 8 steps through the tied Q8_0 LM head runs one row per call
    # (engine.batching.decode_calls); the fixture's routes run it as one call.
    rowwise = replace(small_llama_config, split_small_decode_batches=True, lm_head_batch_from=8)
    cache = SliceCache(tmp_path_factory.mktemp("rowwise"))
    layouts = {"whole": [LayerRange(0, 4)], "split": [LayerRange(0, 3), LayerRange(3, 4)]}
    with open_routes(tiny_model, cache, rowwise, layouts) as opened:
        for layout, route in opened.items():
            oracle = routes["whole"]
            first = [(slot, 0, SESSION_PROMPTS[slot]) for slot in range(3)]
            expected, actual = batched_step(oracle, first), batched_step(route, first)
            for step in range(DECODE_STEPS):
                steps = [
                    (slot, len(SESSION_PROMPTS[slot]) + step, np.array([int(np.argmax(expected[slot][-1]))], np.int32))
                    for slot in (2, 0, 1)
                ]
                expected, actual = batched_step(oracle, steps), batched_step(route, steps)
                for slot in range(3):
                    assert bit_identical(expected[slot], actual[slot]), f"{layout} session {slot} step {step}"
            release_all({"oracle": oracle}, 3)


def test_a_batch_mixing_a_prefill_and_decode_steps_equals_solo(routes: dict[str, LocalRoute]) -> None:
    route = routes["split"]
    solo = {slot: _solo_reference(route, slot) for slot in range(3)}
    route.forward(0, 0, SESSION_PROMPTS[0], "last")
    route.forward(1, 0, SESSION_PROMPTS[1], "last")
    steps = [
        (0, len(SESSION_PROMPTS[0]), np.array([int(np.argmax(solo[0][0]))], np.int32)),
        (2, 0, SESSION_PROMPTS[2]),  # a prefill arriving in the same batch
        (1, len(SESSION_PROMPTS[1]), np.array([int(np.argmax(solo[1][0]))], np.int32)),
    ]
    out = batched_step(route, steps)
    assert bit_identical(out[0][-1], solo[0][1])
    assert bit_identical(out[1][-1], solo[1][1])
    assert bit_identical(out[2][-1], solo[2][0])


def test_a_session_does_not_see_its_neighbours(routes: dict[str, LocalRoute]) -> None:
    route = routes["split"]
    alone = route.forward(0, 0, SESSION_PROMPTS[0], "all")
    route.release(0)
    route.forward(1, 0, SESSION_PROMPTS[1], "all")
    route.forward(3, 0, SESSION_PROMPTS[2], "all")
    assert bit_identical(route.forward(0, 0, SESSION_PROMPTS[0], "all"), alone)


@pytest.mark.parametrize("layout", ["whole", "split"])
def test_truncate_and_replay_reproduces_the_session(routes: dict[str, LocalRoute], layout: str) -> None:
    # What failover and retries rely on: forgetting positions >= k and replaying them from k
    # gives exactly what running the same frames without the detour gives.
    route = routes[layout]
    tokens = SESSION_PROMPTS[1]
    route.forward(0, 0, tokens[:20], "all")
    expected = route.forward(0, 20, tokens[20:], "all")
    route.release(0)
    route.forward(0, 0, tokens[:20], "all")
    route.forward(0, 20, tokens[20:30], "all")
    for backend in route.backends:
        backend.truncate(0, 20)
    assert slot_lengths(route, 0) == [20] * len(route.backends)
    assert bit_identical(route.forward(0, 20, tokens[20:], "all"), expected)
    assert slot_lengths(route, 0) == [len(tokens)] * len(route.backends)
