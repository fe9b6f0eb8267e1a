"""The tokenizer artifact: a vocabulary-only GGUF cut from a source model.

Every metadata key of the source (its ``tokenizer.*`` keys, chat template, hyperparameters and
name) and no tensor: what llama.cpp reads under ``vocab_only``, so a gateway tokenizes and
renders chats exactly as the whole file would, without holding a byte of weights. The bytes
depend on the source's metadata only, so the same source always gives the same artifact hash.
"""

from __future__ import annotations

import os
from pathlib import Path

from gguf import GGUFWriter

from meshnet.artifact.gguf_file import GGUFFile, copy_metadata
from meshnet.artifact.hashing import partial_path
from meshnet.core.errors import ArtifactError

_WRITTEN_BY_WRITER = ("general.architecture", "general.alignment")
"""Keys GGUFWriter writes itself (the architecture; the default alignment for no tensors)."""
_DROPPED_PREFIXES = ("meshnet.slice.", "split.")
"""Slice provenance, and ``gguf-split``'s part numbering: the vocabulary-only file is one whole
file (llama.cpp would look for the other parts of a file that says it is part 1 of N)."""


def _dropped(key: str) -> bool:
    return key in _WRITTEN_BY_WRITER or key.startswith(_DROPPED_PREFIXES)


def write_vocab_only(model: GGUFFile, out: Path) -> Path:
    """Write ``model``'s metadata with an empty tensor table to ``out`` (atomically)."""
    if model.get("tokenizer.ggml.model") in (None, "none"):
        raise ArtifactError(f"{model.path.name} carries no tokenizer to publish")
    out = Path(out)
    writer = GGUFWriter(path=None, arch=model.architecture)
    copy_metadata(writer, model.metadata, skip=_dropped)
    partial = partial_path(out)
    try:
        writer.write_header_to_file(path=partial)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        handle = writer.fout[0] if writer.fout else None
        if handle is not None:
            handle.flush()
            os.fsync(handle.fileno())
        writer.close()
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out
