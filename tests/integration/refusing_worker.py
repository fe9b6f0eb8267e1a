"""A test-only worker that will not take ring batch rows, run as its own process: ``python
refusing_worker.py MODE --data-dir D worker ...``.

It is the normal ``meshnet worker``, but its RingBatch handler turns away every row of a step at
or past ``MESHNET_REFUSE_FROM_STEP`` (default 6) while each session's own stream stays open, so
nothing but the batch stream tells the sender that the row went nowhere. ``MODE``:

- ``refuse``: it refuses the row as a worker does a row whose session it does not hold, naming
  the row's session and step in its ack;
- ``break``: it ends the whole batch stream with an error, the row unanswered;
- ``old``: it is a worker from before ring batches: its record lists no ``ring_batch`` and it
  answers RingBatch and RingReturnBatch with UNIMPLEMENTED (the generated base's answer).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import Any

from meshnet.cli import main as cli
from meshnet.core.errors import Unavailable
from meshnet.core.features import TAIL_FEATURES
from meshnet.node import assembly, servicer
from meshnet.wire.batch_frames import RefusedRow
from meshnet.wire.batch_wire import row_incarnation, row_session, row_step

REFUSE_FROM_STEP = int(os.environ.get("MESHNET_REFUSE_FROM_STEP", "6"))
REASON = "refused by the test's refusing worker"
BREAK = "the test's refusing worker breaks the ring batch stream"
_dispatch = servicer.ShardServicer._dispatch


def _refusing_dispatch(self: Any, row: Any, sender: str | None) -> RefusedRow | None:
    if row_step(row) >= REFUSE_FROM_STEP:
        return RefusedRow(row_session(row), row_step(row), REASON, row_incarnation(row))
    return _dispatch(self, row, sender)


def _breaking_dispatch(self: Any, row: Any, sender: str | None) -> RefusedRow | None:
    if row_step(row) >= REFUSE_FROM_STEP:
        raise Unavailable(BREAK)  # RingBatch ends the stream with it
    return _dispatch(self, row, sender)


_registration = assembly._registration


def _old_registration(*args: Any, **kwargs: Any) -> Any:
    record = _registration(*args, **kwargs)
    return replace(record, capability=replace(record.capability, features=TAIL_FEATURES))


def _be_old() -> None:
    assembly._registration = _old_registration  # type: ignore[assignment]
    del servicer.ShardServicer.RingBatch
    del servicer.ShardServicer.RingReturnBatch


if __name__ == "__main__":
    mode = sys.argv.pop(1)
    if mode == "old":
        _be_old()
    else:
        chosen = {"refuse": _refusing_dispatch, "break": _breaking_dispatch}[mode]
        servicer.ShardServicer._dispatch = chosen  # type: ignore[method-assign]
    sys.exit(cli.main(sys.argv[1:]))
