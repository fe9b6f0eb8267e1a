"""``pace_collector`` freezes start-up's objects and spaces full collections out.

Run in a child interpreter: the collector's settings are the whole process's."""

from __future__ import annotations

import json
import subprocess
import sys

from meshnet.process.collector import SERVER_PACE

PROBE = """
import gc, json
from meshnet.process.collector import pace_collector
before = gc.get_threshold()
pace_collector()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_the_collector_is_paced_and_start_up_frozen() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(done.stdout)
    assert seen["before"] != seen["after"]
    assert tuple(seen["after"]) == (SERVER_PACE.young, SERVER_PACE.middle, SERVER_PACE.oldest)
    assert seen["frozen"] > 1000  # the imports at least
