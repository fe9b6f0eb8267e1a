"""CPU pinning of the bench's child processes: "N machines" must not be N processes fighting
over the same cores, so process i of a lane runs on core i mod (the cores this bench may use).

``os.sched_setaffinity(pid)`` moves only the thread whose id is ``pid``; the children already run
their engine, gRPC and OpenMP threads, so every thread of the process is moved (threads started
later inherit the mask of the thread that starts them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from meshnet.artifact.describe import DecodeWork
from meshnet.core.layers import LayerRange


def usable_cores() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def core_plan(n_processes: int, cores: Sequence[int]) -> tuple[int, ...]:
    """The core of each process: round robin over ``cores``."""
    return tuple(cores[index % len(cores)] for index in range(n_processes)) if cores else ()


def pin_process(pid: int, core: int) -> None:
    """Pin every thread of ``pid`` to ``core`` (a thread that just exited is skipped)."""
    tasks = Path(f"/proc/{pid}/task")
    thread_ids = [int(entry.name) for entry in tasks.iterdir()] if tasks.is_dir() else [pid]
    for thread_id in thread_ids:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(thread_id, {core})


def pin_all(pids: Sequence[int]) -> str:
    """Pin process i of ``pids`` to its core; returns the plan as the report states it."""
    plan = core_plan(len(pids), usable_cores())
    for pid, core in zip(pids, plan, strict=True):
        pin_process(pid, core)
    return ", ".join(f"process {index} -> core {core}" for index, core in enumerate(plan))


def decode_split(work: DecodeWork, shards: int, *, pinned: bool) -> list[LayerRange]:
    """Where a route of ``shards`` worker processes splits for decode. Pinned to fewer cores than
    shards (meshnet-3 on two cores), the shards sharing a core are balanced together against
    the others: the busiest core, not the busiest process, sets the route's pace."""
    return work.split(shards, core_plan(shards, usable_cores()) if pinned else None)


def pinned(command: tuple[str, ...], core: int) -> tuple[tuple[str, ...], str | None]:
    """``command`` under ``taskset -c core`` when that core is ours and taskset exists; else the
    command as is, with why it is not pinned (recorded: unpinned numbers mean less)."""
    if shutil.which("taskset") is None:
        return command, "taskset not found"
    if core not in os.sched_getaffinity(0):
        return command, f"core {core} is not available to this process"
    return ("taskset", "-c", str(core), *command), None
