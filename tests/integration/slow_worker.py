"""A test-only worker that is honestly slow, run as its own process: ``python slow_worker.py
--data-dir D worker ...``.

It is the normal ``meshnet worker`` on an engine that takes ``SECONDS_PER_TOKEN`` longer per
token of every call, its start-up speed measurement included, so the speeds it registers are
the ones it serves at: a 230-token prefill chunk takes it about 7 s, longer than any fixed
per-step timeout of a few seconds would allow.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from meshnet.cli import main as cli
from meshnet.engine import llama_backend

SECONDS_PER_TOKEN = 0.03
_run = llama_backend.LlamaBackend.run


def _slow_run(self: Any, batch: Any) -> Any:
    time.sleep(SECONDS_PER_TOKEN * sum(step.n_tokens for step in batch))
    return _run(self, batch)


if __name__ == "__main__":
    llama_backend.LlamaBackend.run = _slow_run  # type: ignore[method-assign]
    sys.exit(cli.main(sys.argv[1:]))
