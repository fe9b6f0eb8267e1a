"""A test-only worker that is honestly slow, run as its own process: ``python slow_worker.py
--data-dir D worker ...``.

It is the normal ``meshnet worker`` on an engine that takes ``SECONDS_PER_TOKEN`` longer per
token of every call, its start-up speed measurement included, so the speeds it registers are
the ones it serves at: a 230-token prefill chunk takes it about 7 s, longer than any fixed
per-step timeout of a few seconds would allow.

``MESHNET_SLOW_SECONDS_PER_TOKEN`` sets another delay: a few milliseconds make an honest node
several times slower than its peers on the test machine, not unusably slow (the honest heads of
tests/integration/test_audit.py, which a faster rogue must beat to win users' routes).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from meshnet.cli import main as cli
from meshnet.engine import llama_backend

SECONDS_PER_TOKEN = float(os.environ.get("MESHNET_SLOW_SECONDS_PER_TOKEN", "0.03"))
_run = llama_backend.LlamaBackend.run


def _slow_run(self: Any, batch: Any) -> Any:
    time.sleep(SECONDS_PER_TOKEN * sum(step.n_tokens for step in batch))
    return _run(self, batch)


if __name__ == "__main__":
    llama_backend.LlamaBackend.run = _slow_run  # type: ignore[method-assign]
    sys.exit(cli.main(sys.argv[1:]))
