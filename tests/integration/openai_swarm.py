"""A live swarm (tracker, workers, gateway) and the official openai client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
from swarm_harness import Swarm


@contextmanager
def openai_swarm(
    directory: Path, model: Path, *ranges: str, **tracker_fields: Any
) -> Iterator[tuple[Swarm, openai.OpenAI]]:
    """Workers on ``ranges`` (one each), routable, and a client with no retries: a failure shows.
    ``tracker_fields`` set the tracker's config over the harness's (``Swarm.start_tracker``)."""
    with Swarm(directory, model) as swarm:
        swarm.start_tracker(**tracker_fields)
        swarm.start_workers(*ranges)
        base_url = swarm.start_gateway()
        swarm.wait_routable(nodes=len(ranges))
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=60.0) as api:
            yield swarm, api
