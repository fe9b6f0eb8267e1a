"""Diagnostics only: where a process's asyncio event loop spends its long stretches.

Put this folder first on ``PYTHONPATH`` and set ``MESHNET_LOOP_STALLS=/some/prefix``: every
Python process started so (a tracker under ``meshnet bench-tracker-scale``, its load
generators) appends to ``/some/prefix.<pid>`` every 30 s and at exit, since it started:

* a histogram of every loop callback's duration (whole milliseconds);
* the callbacks longer than ``MESHNET_LOOP_STALLS_MS`` (default 5), by coroutine name;
* each garbage collector generation's collections, total and longest pause, objects freed;
* in a tracker: plan cache hits and misses and how long each replan took.

Not for production: it wraps ``asyncio.events.Handle._run`` (a private method; about a
microsecond per callback) and ``PlanCache.plan``. Issue 36 (task p99x38) used it to find
that a 3,000-node tracker's longest callbacks were its replans (8-12 ms each under a
contended core, about 16 per second), not the collector or SQLite.
"""

from __future__ import annotations

import os

if os.environ.get("MESHNET_LOOP_STALLS"):
    import atexit
    import gc
    import sys
    import threading
    import time
    from asyncio import events
    from collections import Counter
    from typing import Any

    OUT = f"{os.environ['MESHNET_LOOP_STALLS']}.{os.getpid()}"
    SLOW_S = float(os.environ.get("MESHNET_LOOP_STALLS_MS", "5")) / 1000.0
    callbacks_ms: Counter[int] = Counter()
    slow_count: Counter[str] = Counter()
    slow_ms: Counter[str] = Counter()
    collections: dict[int, list[float]] = {}
    """Generation -> [count, total seconds, longest seconds, objects collected]."""
    plans: list[Any] = []
    replans_ms: Counter[int] = Counter()
    collection_started: dict[int, float] = {}
    original_run = events.Handle._run

    def _name(handle: events.Handle) -> str:
        callback = handle._callback  # type: ignore[attr-defined]
        task = getattr(callback, "__self__", None)
        if task is not None and hasattr(task, "get_coro"):
            return str(getattr(task.get_coro(), "__qualname__", "task"))
        return str(getattr(callback, "__qualname__", repr(callback)))[:80]

    def _timed_run(handle: events.Handle) -> None:
        started = time.perf_counter()
        try:
            original_run(handle)
        finally:
            took = time.perf_counter() - started
            callbacks_ms[min(int(took * 1000), 200)] += 1
            if took > SLOW_S:
                slow_count[_name(handle)] += 1
                slow_ms[_name(handle)] += took * 1000

    def _collected(phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            collection_started[generation] = time.perf_counter()
            return
        took = time.perf_counter() - collection_started.get(generation, time.perf_counter())
        stats = collections.setdefault(generation, [0, 0.0, 0.0, 0])
        stats[0] += 1
        stats[1] += took
        stats[2] = max(stats[2], took)
        stats[3] += info["collected"]

    def _watch_plans() -> None:
        """Time the tracker's replans (the planner a plan cache miss calls), once it is loaded."""
        module = sys.modules.get("meshnet.tracker.plan_cache")
        if module is None or plans:
            return
        plans.extend(o for o in gc.get_objects() if type(o).__name__ == "PlanCache")
        original_plan = module.PlanCache.plan

        def plan(self: Any, name: str, asked: str, mixed: bool, planner: Any) -> Any:
            def timed() -> Any:
                started = time.perf_counter()
                try:
                    return planner()
                finally:
                    replans_ms[min(int((time.perf_counter() - started) * 1000), 100)] += 1

            return original_plan(self, name, asked, mixed, timed)

        module.PlanCache.plan = plan

    def _write() -> None:
        with open(OUT, "a") as out:  # one block per 30 s, each since start: subtract two for a span
            out.write(f"at {time.time():.0f}\ncallbacks_ms {sorted(callbacks_ms.items())}\n")
            out.writelines(
                f"slow {count} {slow_ms[name]:.0f} ms {name}\n" for name, count in slow_count.most_common(30)
            )
            out.writelines(
                f"gc gen{generation} {count} {total * 1000:.0f} ms, max {longest * 1000:.1f} ms, {collected} freed\n"
                for generation, (count, total, longest, collected) in sorted(collections.items())
            )
            out.write(f"plan_cache {[(cache.hits, cache.misses) for cache in plans]}\n")
            out.write(f"replans_ms {sorted(replans_ms.items())}\n")

    def _every_30_s() -> None:
        while True:
            time.sleep(30)
            _watch_plans()
            _write()

    if os.environ.get("MESHNET_LOOP_STALLS_SWITCH_S"):
        # An experiment: how much of a pause is waiting for the GIL back from another thread.
        sys.setswitchinterval(float(os.environ["MESHNET_LOOP_STALLS_SWITCH_S"]))
    events.Handle._run = _timed_run  # type: ignore[method-assign]
    gc.callbacks.append(_collected)
    threading.Thread(target=_every_30_s, name="loop-stalls", daemon=True).start()
    atexit.register(_write)
