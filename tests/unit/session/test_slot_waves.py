"""A route's head forms its decode waves of neighbouring slots (``slot_waves``) and runs a complete
wave before a partial one (``next_wave``), so that each wave is one llama.cpp graph: a call's rows
run as one graph only where their sequence ids are consecutive (``engine.batching.decode_calls``).

That the rows compute the same however they are batched is tests/unit/engine (real llama.cpp);
here is which rows a tick takes, and that waves made so stay made."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from meshnet.session.scheduler import PendingWork, next_wave, plan_tick, slot_waves

NOW, HOLD = 4.5, 10.0
"""A hold longer than any step here has waited: only completeness decides."""


def step(ticket: int, slot: int, at: float, n_tokens: int = 1) -> PendingWork:
    return PendingWork(ticket, n_tokens, at, None, slot)


def test_waves_are_runs_of_neighbouring_slots_in_order() -> None:
    assert slot_waves(range(8), 3) == ((0, 1, 2), (3, 4, 5), (6, 7))
    assert slot_waves({7, 0, 5, 1, 2, 6, 3, 4}, 3) == ((0, 1, 2), (3, 4, 5), (6, 7))
    # A session that left leaves a hole: the waves close over it (the fewest graphs that remain).
    assert slot_waves({0, 1, 2, 4, 5, 6}, 3) == ((0, 1, 2), (4, 5, 6))
    assert slot_waves({3}, 1) == ((3,),)
    assert slot_waves((), 3) == ()


def test_a_complete_wave_runs_before_an_older_partial_one() -> None:
    waves = ((0, 1, 2), (3, 4, 5))
    ready = [step(1, 0, 1.0), step(2, 1, 1.0), step(3, 3, 2.0), step(4, 4, 2.0), step(5, 5, 2.0)]
    assert [w.slot for w in next_wave(ready, waves, now=NOW, hold_s=HOLD)] == [3, 4, 5]


def test_without_a_complete_wave_the_oldest_steps_wave_runs_what_is_ready() -> None:
    waves = ((0, 1, 2), (3, 4, 5))
    ready = [step(1, 4, 1.0), step(2, 0, 2.0), step(3, 5, 3.0), step(4, 1, 4.0)]
    assert [w.slot for w in next_wave(ready, waves, now=NOW, hold_s=HOLD)] == [4, 5]


def test_a_partial_wave_held_as_long_as_the_hold_runs_first() -> None:
    # Slot 2 is a session between two turns: its wave would never be complete.
    waves = ((0, 1, 2), (3, 4, 5))
    ready = [step(1, 0, 1.0), step(2, 1, 1.0), step(3, 3, 2.0), step(4, 4, 2.0), step(5, 5, 2.0)]
    assert [w.slot for w in next_wave(ready, waves, now=1.9, hold_s=1.0)] == [3, 4, 5]
    assert [w.slot for w in next_wave(ready, waves, now=2.0, hold_s=1.0)] == [0, 1]


def test_a_slot_outside_every_wave_is_a_wave_of_its_own() -> None:
    # A session that just started decoding, before the waves were cut again.
    waves = ((0, 1, 2),)
    ready = [step(1, 6, 1.0), step(2, 0, 2.0), step(3, 1, 2.0), step(4, 2, 2.0)]
    assert [w.slot for w in next_wave(ready, waves, now=NOW, hold_s=HOLD)] == [6]


def test_one_row_waves_and_no_waves_run_oldest_first() -> None:
    ready = [step(1, 5, 1.0), step(2, 0, 2.0), step(3, 3, 3.0)]
    assert [w.slot for w in next_wave(ready, slot_waves({0, 3, 5}, 1), now=NOW, hold_s=HOLD)] == [5]
    assert [w.slot for w in next_wave(ready, (), now=NOW, hold_s=HOLD)] == [5, 0, 3]


def test_a_tick_takes_one_wave_and_still_one_prefill_chunk() -> None:
    pending = [step(1, 3, 1.0), step(2, 0, 1.5), step(3, 1, 1.5), step(4, 2, 1.5), step(5, 6, 0.5, n_tokens=64)]
    plan = plan_tick(pending, now=2.0, max_decode_batch=3, waves=((0, 1, 2), (3, 4, 5)), hold_s=HOLD)
    assert plan.run == (2, 3, 4, 5)
    # The rule before waves of slots: the oldest ready steps, whichever slots they hold.
    assert plan_tick(pending, now=2.0, max_decode_batch=3).run == (1, 2, 3, 5)


@dataclass
class Pipeline:
    """A head that runs one tick per time unit and a rest of the route that answers a tick's
    sessions together ``latency`` later (one frame back), as pinned meshnet-2 does."""

    latency: float = 1.5
    hold: float = 2.0
    """Two of the head's ticks, as the engine passes."""
    idle: frozenset[int] = frozenset()
    """Sessions that stop after their first step (between two turns): never ready again."""
    now: float = 0.0
    ready: dict[int, float] = field(default_factory=dict)
    """Slot -> when its next decode step reached the head."""
    ticks: list[tuple[int, ...]] = field(default_factory=list)
    tickets: int = 0

    def run(self, ticks: int, size: int, *, by_slot: bool) -> list[tuple[int, ...]]:
        waves = slot_waves(self.ready, size) if by_slot else ()
        while len(self.ticks) < ticks:
            due = {slot: at for slot, at in self.ready.items() if at <= self.now}
            if not due:
                self.now = min(at for at in self.ready.values() if at != float("inf"))
                continue
            pending = [step(self.ticket(), slot, at) for slot, at in sorted(due.items(), key=lambda item: item[1])]
            plan = plan_tick(pending, now=self.now, max_decode_batch=size, waves=waves, hold_s=self.hold)
            slots = tuple(sorted(w.slot for w in pending if w.ticket in plan.run))
            self.now += 1.0
            for slot in slots:
                self.ready[slot] = self.now + self.latency if slot not in self.idle else float("inf")
            self.ticks.append(slots)
        return self.ticks

    def ticket(self) -> int:
        self.tickets += 1
        return self.tickets


def test_waves_of_slots_form_from_scattered_arrivals_and_stay_formed() -> None:
    # Eight sessions reach decode in a scattered order (their prompts' prefills end at different
    # times), as in the bench's concurrency-8 runs; waves of three.
    arrivals = {5: 0.0, 2: 0.2, 7: 0.4, 0: 0.6, 4: 0.8, 1: 1.0, 6: 1.2, 3: 1.4}
    waves = set(slot_waves(arrivals, 3))
    by_slot = Pipeline(ready=dict(arrivals)).run(40, 3, by_slot=True)
    assert set(by_slot[-20:]) == waves  # every tick of the steady state is one whole wave
    # The rule before, the oldest ready steps: the threes the arrival order made ran together for
    # good, and none of them is a run of neighbouring slots (each tick two or three graphs).
    by_age = Pipeline(ready=dict(arrivals)).run(40, 3, by_slot=False)
    assert set(by_age[-20:]) == {(0, 2, 7), (1, 4, 6), (3, 5)}


def test_a_wave_with_a_member_that_stopped_still_runs_within_the_hold() -> None:
    # Slot 2 stops after its first step (a conversation between turns, its slot still held), so
    # the wave (0, 1, 2) is never complete again, while the two complete waves could keep the
    # head busy on their own; slots 0 and 1 must still decode, every few ticks.
    arrivals = {slot: 0.1 * slot for slot in range(9)}
    ticks = Pipeline(ready=dict(arrivals), idle=frozenset({2}), latency=0.5).run(60, 3, by_slot=True)
    runs_of_0 = [index for index, slots in enumerate(ticks) if 0 in slots]
    assert runs_of_0[-1] >= 55 and max(b - a for a, b in itertools.pairwise(runs_of_0[5:])) <= 4
    assert set(ticks[-20:]) == {(0, 1), (3, 4, 5), (6, 7, 8)}
