"""The one name a model is served under, whichever way the swarm was started.

The published ``--name`` (the manifest's ``model_id``) when there is one, else the source file's
stem made a valid model id. ``meshnet publish`` names a manifest with it, ``describe_model``
names a local file with it, and workers fetching by model id, the gateway (by ``--model`` or
``--model-id``), ``up`` and ``generate`` all serve under what it returns, so ``/v1/models``
says the same whatever started the swarm. An explicit ``--model-name`` is the published name
of a local file.
"""

from __future__ import annotations

import re
from pathlib import Path

from meshnet.artifact.gguf_split import first_part

MAX_MODEL_ID = 128
"""Longest model id a manifest accepts (``manifest_codec``)."""

_SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")
"""llama.cpp's part suffix (``llama_split_path``), without the ``.gguf`` a stem has lost."""


def served_model_id(source: Path | str, published: str | None = None) -> str:
    """``published`` if given, else ``source``'s stem with runs of other characters turned into
    ``-`` (what a manifest's model id may hold: letters, digits, ``.``, ``_``, ``-``)."""
    if published:
        return published
    if Path(source).is_dir():  # a set given as its directory is named by its first part
        source = first_part(Path(source))
    # A gguf-split set is one model: its first part's stem without the part suffix.
    whole = _SPLIT_SUFFIX.sub("", Path(source).stem)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", whole).strip("-._")[:MAX_MODEL_ID]
    return stem or "model"
