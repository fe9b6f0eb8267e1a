"""A test-only boasting worker, run as its own process:
``python boasting_worker.py [--claim-rate R] [--rtt-ms X] [--step-delay-ms D] -- ARGS``,
where ``ARGS`` are ``meshnet``'s own (``--data-dir D worker ...``).

It is the normal ``meshnet worker`` with the changes an operator could make to their own copy to
win traffic: its record claims a decode rate of ``R`` tok/s over its layers, whatever it
measured itself, its heartbeats report a round trip of ``X`` ms to every peer the tracker asked
it to measure, measured or not, and (to be a node whose served speed falls far below its claim,
unambiguously on a loaded machine) every step it runs waits ``D`` ms before its output leaves.
What it computes is honest: its answers are the whole model's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from typing import Any

from meshnet.cli import main as cli
from meshnet.node import assembly, forward_stage, peers, stages


def _options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="boasting_worker")
    parser.add_argument("--claim-rate", type=float, default=None)
    parser.add_argument("--rtt-ms", type=float, default=None)
    parser.add_argument("--step-delay-ms", type=float, default=0.0)
    split = argv.index("--")
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def _install(options: argparse.Namespace) -> None:
    honest_registration = assembly._registration
    delay_s = options.step_delay_ms / 1000.0

    def boasting_registration(*args: Any) -> Any:
        honest = honest_registration(*args)
        return replace(honest, capability=replace(honest.capability, decode_tokens_per_s=options.claim_rate))

    if options.claim_rate is not None:
        assembly._registration = boasting_registration
    if options.rtt_ms is not None:
        rtt_ms = options.rtt_ms

        def boasted_latencies(self: Any) -> tuple[tuple[str, float], ...]:
            return tuple((address, rtt_ms) for address in self._targets)

        peers.PeerProber.latest = boasted_latencies  # type: ignore[method-assign]
    if delay_s > 0:
        for stage in (forward_stage.ForwardStage, stages.SampleStage):
            _slow_down(stage, delay_s)


def _slow_down(stage: Any, delay_s: float) -> None:
    emit = stage.emit

    async def slow_emit(self: Any, *args: Any) -> Any:
        await asyncio.sleep(delay_s)
        return await emit(self, *args)

    stage.emit = slow_emit


if __name__ == "__main__":
    boast, meshnet_argv = _options(sys.argv[1:])
    _install(boast)
    sys.exit(cli.main(meshnet_argv))
