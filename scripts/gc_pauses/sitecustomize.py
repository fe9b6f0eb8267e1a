"""Diagnostics only: what each cyclic garbage collection of a process costs, and why.

Put this folder first on ``PYTHONPATH`` and set ``MESHNET_GC_PAUSES=/some/prefix``: every Python
process started so appends to ``/some/prefix.<pid>`` every 20 s and at exit. Per collection it
records the generation, ``gc.get_count()`` at its start, the wall and the thread CPU time it took
(wall much longer than CPU means the thread waited: the GIL given away by a C destructor, or the
core taken by another thread), and the objects freed. Every ``MESHNET_GC_PAUSES_SAMPLE``-th young
collection (default 25), from 45 s after start (``MESHNET_GC_PAUSES_AFTER_S``), is a probe instead, alternating between:

* ``census``: the young generation's size and types and its largest containers at the start;
* ``saveall``: ``gc.DEBUG_SAVEALL`` for that one collection, so it finds the garbage but frees
  nothing (the pause without the deallocation), and the garbage's types.

Issue 36 (task gc39) used it to explain the 30-ms young collections of a 3,000-node tracker.
"""

from __future__ import annotations

import os

if os.environ.get("MESHNET_GC_PAUSES"):
    import atexit
    import gc
    import threading
    import time
    from collections import Counter

    OUT = f"{os.environ['MESHNET_GC_PAUSES']}.{os.getpid()}"
    SAMPLE = int(os.environ.get("MESHNET_GC_PAUSES_SAMPLE", "25"))
    # No probe during start-up: a census or a saved garbage list in the middle of an import
    # broke the import lock's bookkeeping (KeyError in importlib's _ModuleLock.acquire).
    PROBES_FROM = time.monotonic() + float(os.environ.get("MESHNET_GC_PAUSES_AFTER_S", "45"))
    records: list[tuple[float, int, str, int, float, float, int]] = []
    """(time, generation, kind, young count at start, wall ms, thread CPU ms, collected)."""
    probes: list[str] = []
    state: dict[str, object] = {"young": 0, "kind": "plain"}
    lock = threading.Lock()

    def _census() -> str:
        young = gc.get_objects(0)
        types = Counter(type(o).__qualname__ for o in young)
        sizes = sorted(((len(gc.get_referents(o)), type(o).__qualname__) for o in young), reverse=True)[:8]
        referents = sum(size for size, _ in sizes)
        del young
        return f"census n={sum(types.values())} top_referents={sizes} sum8={referents} types={types.most_common(15)}"

    def _collected(phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            kind = "plain"
            if generation == 0 and time.monotonic() > PROBES_FROM:
                state["young"] = int(state["young"]) + 1  # type: ignore[call-overload]
                turn = int(state["young"]) % SAMPLE  # type: ignore[call-overload]
                if turn == 0:
                    kind = "census"
                    probes.append(f"{time.time():.1f} {_census()}")
                elif turn == SAMPLE // 2:
                    kind = "saveall"
                    gc.set_debug(gc.DEBUG_SAVEALL)
            state["kind"] = kind
            state["count"] = gc.get_count()[0]
            state["wall"] = time.perf_counter()
            state["cpu"] = time.thread_time()
            return
        wall = (time.perf_counter() - float(state["wall"])) * 1000  # type: ignore[arg-type]
        cpu = (time.thread_time() - float(state["cpu"])) * 1000  # type: ignore[arg-type]
        kind = str(state["kind"])
        if kind == "saveall":
            gc.set_debug(0)
            garbage = Counter(type(o).__qualname__ for o in gc.garbage)
            probes.append(f"{time.time():.1f} saveall n={len(gc.garbage)} types={garbage.most_common(15)}")
            gc.garbage.clear()  # the cycles stay, uncollected until a full collection: a small leak
        with lock:
            records.append((time.time(), generation, kind, int(state["count"]), wall, cpu, info["collected"]))  # type: ignore[call-overload]

    def _write() -> None:
        with lock:
            batch = records[:]
            records.clear()
        done = probes[:]
        probes.clear()
        with open(OUT, "a") as out:
            out.writelines(
                f"gc {t:.2f} gen{g} {k} count={c} wall={w:.2f} cpu={u:.2f} freed={f}\n" for t, g, k, c, w, u, f in batch
            )
            out.writelines(f"probe {line}\n" for line in done)

    def _every_20_s() -> None:
        while True:
            time.sleep(20)
            _write()

    gc.callbacks.append(_collected)
    threading.Thread(target=_every_20_s, name="gc-pauses", daemon=True).start()
    atexit.register(_write)
