"""Bounded peers (issue 29, finding 4): a worker certificate of the swarm's own CA squatting on the
tail's KV slots must not turn users away.

A real swarm (tracker, two llama.cpp workers, gateway; mTLS from the swarm CA) with 4 slots a
shard. The squatter holds worker certificates minted from the swarm CA and speaks the repo's own
wire client (``ShardStream``) to the tail: it opens sessions until refused and keeps each alive
with ring steps (the probe's "one step every 10 s", faster here). Before the fix it held 4 of 4
slots for as long as it liked and every user request got 503.

- One certificate fills the free slots, then is refused naming its bound (2 of 4); each user
  request takes a slot back from it (one, as they come one at a time), its steps arriving fast
  enough to stay within their budget.
- Two certificates hold 2 slots each (each at its bound) with a trickle of one position a
  second, slower than the shard's minimum rate: users are refused while the sessions' budget
  lasts (``GRACE_S`` + positions / ``MIN_RATE``, ~7 s here), then served.

Every served answer equals the whole model's (``Reference``).

Since route tickets, a certificate opens a session on a shard only with a tracker-signed ticket
that names it as the hop before: the squatter here holds such tickets (signed with a tracker
identity of the swarm CA, as a head worker of real routes receives them), the strongest position
the bounds must hold against.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest
from swarm_harness import PROMPT, Reference, Swarm, Worker, chat_body, wait_sessions_freed, write_tiny_model

from meshnet.core.errors import MeshnetError, ResourceExhausted
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tickets import DEFAULT_TICKET_S, SealedTicket
from meshnet.route.shard_admin import fetch_capability
from meshnet.route.shard_stream import ChannelPool, ShardStream
from meshnet.security.certificates import read_peer
from meshnet.security.swarm_dir import load_identity, local_identity
from meshnet.security.tickets import TicketSigner
from meshnet.wire.frames import FrameMeta, HopSpec, StepFrame
from meshnet.wire.ticket_wire import issue_ticket
from meshnet.wire.tls import LinkSecurity

pytestmark = pytest.mark.timeout(240)

SLOTS = 4
MIN_RATE = 4.0
"""Positions per second a session must average (``--session-min-rate``) to keep its slot under pressure."""
GRACE_S = 3.0
BOUNDS = {"max_sessions": SLOTS, "session_min_rate": MIN_RATE, "session_grace": GRACE_S}
"""The workers' settings; ``--session-share`` keeps its default, 0.5: a bound of 2 of 4 slots."""
PROMPT_ROWS = 8
MAX_TOKENS = 12
FAST = (0.25, 4)
"""A trickle well within budget: 4 positions every 0.25 s (16/s against the minimum 4/s)."""
SLOW = (1.0, 1)
"""The probe's trickle: one position at a time (every second here, every 10 s in the probe)."""
SERVED_WITHIN_S = 25.0


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    root = tmp_path_factory.mktemp("bounded-peers")
    with Swarm(root, write_tiny_model(root)) as running:
        running.start_tracker()
        running.start_workers("0:3", "3:6", **BOUNDS)
        running.start_gateway()
        running.wait_routable(2)
        yield running


@pytest.fixture(scope="module")
def expected(swarm: Swarm, tmp_path_factory: pytest.TempPathFactory) -> str:
    reference = Reference(swarm.model, tmp_path_factory.mktemp("reference-cache"))
    try:
        return reference.text(reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS))
    finally:
        reference.close()


@dataclass
class Held:
    stream: ShardStream
    session_id: SessionId
    step: int = 0
    position: int = PROMPT_ROWS
    lost: str | None = None


@dataclass
class Squatter:
    """Sessions on one shard held with one worker certificate of the swarm CA."""

    name: str
    shard: Worker
    pool: ChannelPool
    fingerprint: str
    n_embd: int
    node_id: NodeId
    signer: TicketSigner
    held: list[Held] = field(default_factory=list)
    rounds: int = 0
    """Trickle rounds done: one frame to every held session each."""

    @classmethod
    async def start(cls, swarm: Swarm, name: str, shard: Worker) -> Squatter:
        identity = load_identity(local_identity(swarm.root, name, "worker", time.time()))
        security = LinkSecurity(identity)
        pool = ChannelPool(4 * 1024 * 1024, security)
        capability = await fetch_capability(pool, shard.address, node_id=shard.node_id)
        record = capability.record
        node_id = NodeId(read_peer(identity.cert_pem, identity.ca_pem, time.time()).node_id)
        tracker = load_identity(local_identity(swarm.root, "squatter-tickets", "tracker", time.time()))
        signer = TicketSigner(lambda: tracker)
        return cls(name, shard, pool, record.fingerprint, record.capability.n_embd, node_id, signer)

    def _ticket(self, meta: FrameMeta) -> SealedTicket:
        """A tracker-signed ticket naming this certificate as the hop before the shard."""
        before = HopSpec("127.0.0.1:1", LayerRange(0, self.shard.layers.start), self.fingerprint, self.node_id)
        at = HopSpec(self.shard.address, self.shard.layers, self.fingerprint, NodeId(self.shard.node_id))
        return issue_ticket(
            (before, at),
            session_id=meta.session_id,
            request_id=meta.request_id,
            epoch=meta.route_epoch,
            fingerprint=self.fingerprint,
            holder=self.node_id,
            now_unix_s=time.time(),
            seconds=DEFAULT_TICKET_S,
            signer=self.signer,
        )

    def _frame(self, held: Held, rows: int, *, opening: bool) -> StepFrame:
        meta = FrameMeta(
            request_id=RequestId(f"req-{held.session_id}"),
            session_id=held.session_id,
            route_epoch=2**40,  # never older than the shard's: the tracker's epoch grows by ones
            fingerprint=self.fingerprint,
            layers=self.shard.layers,
            phase="decode" if rows == 1 else "prefill",  # a decode frame carries one position
            position=0 if opening else held.position,
            step=held.step,
            cache="new" if opening else "continue",
        )
        hidden = np.random.default_rng(held.step).standard_normal((rows, self.n_embd)).astype(np.float32)
        if opening:
            return StepFrame(meta, hidden=hidden, sampling=SamplingParams(), ticket=self._ticket(meta))
        return StepFrame(meta, hidden=hidden, ring=True)

    async def open(self, index: int) -> Held:
        """One more session on the shard (raises the shard's refusal)."""
        held = Held(
            ShardStream(self.pool, self.shard.address, None, self.shard.node_id), SessionId(f"{self.name}-{index}")
        )
        try:
            await held.stream.exchange(self._frame(held, PROMPT_ROWS, opening=True))
        except MeshnetError:
            held.stream.cancel()
            raise
        self.held.append(held)
        return held

    async def open_until_refused(self, at_most: int = 2 * SLOTS) -> ResourceExhausted:
        for index in range(at_most):
            try:
                await self.open(len(self.held) + index)
            except ResourceExhausted as refusal:
                return refusal
        raise AssertionError(f"{self.name} opened {at_most} sessions on {SLOTS} slots without a refusal")

    async def trickle(self, every_s: float, rows: int) -> None:
        """Step every held session on, ``rows`` positions each ``every_s``, until cancelled."""
        while True:
            for held in self.alive:
                held.step += 1
                try:
                    await held.stream.send(self._frame(held, rows, opening=False))
                except MeshnetError as error:
                    held.lost = f"[{error.code}] {error.message}"
                    continue
                held.position += rows
            self.rounds += 1
            await asyncio.sleep(every_s)

    async def until_lost(self, count: int, within_s: float = 30.0) -> None:
        """Wait until the trickle has learnt that ``count`` of its sessions were evicted."""
        deadline = time.monotonic() + within_s
        while len(self.held) - len(self.alive) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {count} of the squatter's sessions were evicted within {within_s} s")
            await asyncio.sleep(0.05)

    async def more_rounds(self, count: int, within_s: float = 30.0) -> None:
        """Wait until the trickle has stepped every held session ``count`` more times.

        An evicted session is learnt only from a later frame on its stream (a ring frame gets no
        answer: the send after the shard's abort fails), so counting right after the users were
        served would race the trickle."""
        target, deadline = self.rounds + count, time.monotonic() + within_s
        while self.rounds < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"the trickle made {self.rounds} of {target} rounds in {within_s} s")
            await asyncio.sleep(0.05)

    @property
    def alive(self) -> list[Held]:
        return [held for held in self.held if held.lost is None]

    async def close(self) -> None:
        for held in self.held:
            held.stream.cancel()
        await self.pool.close()


async def ask(client: httpx.AsyncClient, swarm: Swarm) -> httpx.Response:
    base_url = swarm.gateways[0].ready_line.split()[3]
    body = chat_body(MAX_TOKENS, stream=False)
    return await client.post(f"{base_url}/v1/chat/completions", json=body, headers=swarm.auth, timeout=30.0)


def answer(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


async def test_one_worker_certificate_filling_the_tail_gives_users_their_slots_back(
    swarm: Swarm, expected: str
) -> None:
    tail = swarm.live_workers("3:6")[0]
    squatter = await Squatter.start(swarm, "squatter", tail)
    trickle: asyncio.Task[None] | None = None
    try:
        refusal = await squatter.open_until_refused()
        assert len(squatter.held) == SLOTS  # every free slot: admission is work-conserving
        trickle = asyncio.create_task(squatter.trickle(*FAST))
        asked = time.monotonic()
        async with httpx.AsyncClient() as client:
            answers = [answer(await ask(client, swarm)) for _ in range(2 * SLOTS)]
        print(f"\n{len(answers)} user requests served one after another in {time.monotonic() - asked:.2f} s")
        await squatter.until_lost(1)
        await squatter.more_rounds(2)  # and no more than the one: the rest keep their slots
        lost = [held.lost for held in squatter.held if held.lost]
        print(f"squatter refused with: {refusal.message}; {len(squatter.alive)} of its sessions alive after: {lost}")
        assert answers == [expected] * len(answers)
        assert "bound of 2" in refusal.message
        # One user at a time needed one slot: one taken back, the rest still the squatter's (its
        # share is 2, and a user's slot is free again once it is served).
        assert len(squatter.alive) == SLOTS - 1
    finally:
        if trickle is not None:
            trickle.cancel()
        await squatter.close()
    await asyncio.to_thread(wait_sessions_freed, [w.address for w in swarm.workers], 10.0, swarm.security)


async def test_a_trickle_of_steps_cannot_hold_the_tail_for_ever(swarm: Swarm, expected: str) -> None:
    tail = swarm.live_workers("3:6")[0]
    squatters = [await Squatter.start(swarm, f"trickler-{i}", tail) for i in range(3)]
    newcomer = squatters.pop()
    trickles: list[asyncio.Task[None]] = []
    try:
        for squatter in squatters:
            for index in range(2):
                await squatter.open(index)
        started = time.monotonic()
        refusals = [await squatter.open_until_refused() for squatter in squatters]
        trickles = [asyncio.create_task(squatter.trickle(*SLOW)) for squatter in squatters]
        # At their bounds and within their budget, the squatters' slots are theirs: a certificate
        # under its bound finds nothing it may take.
        with pytest.raises(ResourceExhausted, match="hold active sessions"):
            await newcomer.open(0)
        refused = 0
        async with httpx.AsyncClient() as client:
            while (response := await ask(client, swarm)).status_code == 503:
                refused += 1
                assert time.monotonic() - started < SERVED_WITHIN_S, "the trickled sessions held the tail"
                await asyncio.sleep(0.25)
            served_after = time.monotonic() - started
            text = answer(response)
        budget = (GRACE_S + PROMPT_ROWS / MIN_RATE) / (1 - SLOW[1] / SLOW[0] / MIN_RATE)
        print(
            f"\nfirst user request served {served_after:.1f} s into the attack (budget of a trickled session "
            f"{budget:.1f} s), after {refused} refusals through the gateway"
        )
        assert text == expected
        assert all("bound of 2" in refusal.message for refusal in refusals)
        assert served_after > GRACE_S
    finally:
        for task in trickles:
            task.cancel()
        for squatter in [*squatters, newcomer]:
            await squatter.close()
    await asyncio.to_thread(wait_sessions_freed, [w.address for w in swarm.workers], 10.0, swarm.security)
