"""A test-only worker whose engine can wedge, run as its own process: ``python wedged_worker.py
--data-dir D worker ...``.

It is the normal ``meshnet worker``, except that a ring step numbered ``WEDGE_AT_STEP`` it
computes may never complete: the step waits forever after the engine ran it, as a shard whose
engine call hangs would. Exactly one such step wedges per removal of the marker file named by
``MESHNET_TEST_WEDGE_MARKER`` (the first tail to recreate it wedges), so a test arms one wedge on
whichever tail its route runs through. Its process stays alive, its event loop runs, its health
service answers SERVING and its gRPC core answers every keepalive ping, so transport keepalive
cannot notice it; only a per-step deadline can. The wedged step ends when its session's stream is cancelled.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from meshnet.cli import main as cli
from meshnet.node import stages

WEDGE_AT_STEP = 40
MARKER_ENV = "MESHNET_TEST_WEDGE_MARKER"
_emit = stages.SampleStage.emit


def _armed() -> bool:
    """Whether this step wedges: it does when it recreates the marker (only one can)."""
    try:
        os.close(os.open(os.environ[MARKER_ENV], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except (KeyError, FileExistsError):
        return False
    return True


async def _wedging_emit(self: Any, state: Any, frame: Any, output: Any, deadline: Any, timing: Any) -> Any:
    if frame.ring and frame.meta.step == WEDGE_AT_STEP and _armed():
        print(f"wedged at step {frame.meta.step} of session {frame.meta.session_id}", file=sys.stderr, flush=True)
        await asyncio.Event().wait()  # until the session's stream is cancelled
    return await _emit(self, state, frame, output, deadline, timing)


if __name__ == "__main__":
    stages.SampleStage.emit = _wedging_emit  # type: ignore[method-assign]
    sys.exit(cli.main(sys.argv[1:]))
