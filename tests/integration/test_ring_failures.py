"""The ring keeps the chain's failure handling: a shard killed mid-decode ends the request at
the driver within seconds with a retryable error (the head learns it from its watch on the
downstream stream or from the tail's RingReturn stream), and the surviving shards free the
session. Each test starts its own route, since it kills one of its workers.

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp. A worker killed under a real model, with failover or worker_lost
at the gateway: test_swarm_failover.py.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from worker_harness import WorkerCluster, fake_specs, greedy_request, new_driver, route_session, wait_idle

from meshnet.core.errors import MeshnetError
from meshnet.core.events import TokenGenerated
from meshnet.route.shard_stream import ChannelPool

pytestmark = pytest.mark.timeout(90)

PROMPT = [4, 8, 15, 16, 23, 42]
KILL_AFTER_TOKENS = 5
ENDS_WITHIN_S = 5.0


@pytest.mark.parametrize("victim", [1, 2], ids=["middle", "tail"])
async def test_a_shard_killed_mid_ring_decode_ends_the_request_and_frees_the_survivors(
    tmp_path: Path, pool: ChannelPool, victim: int
) -> None:
    with WorkerCluster(tmp_path) as cluster:
        route = cluster.start(*fake_specs([(0, 2), (2, 4), (4, 6)], step_delay=0.01))
        events = new_driver(pool).run(await route_session(pool, route), greedy_request(PROMPT, 10_000))
        tokens, killed_at = 0, 0.0
        with pytest.raises(MeshnetError) as failure:
            async for event in events:
                if isinstance(event, TokenGenerated):
                    tokens += 1
                    if tokens == KILL_AFTER_TOKENS:
                        route[victim].send_signal(signal.SIGKILL)
                        killed_at = time.monotonic()
        assert killed_at, "the route never decoded"
        assert time.monotonic() - killed_at < ENDS_WITHIN_S
        assert failure.value.retryable, failure.value
        survivors = [worker for index, worker in enumerate(route) if index != victim]
        await wait_idle(pool, survivors, within_s=ENDS_WITHIN_S)
