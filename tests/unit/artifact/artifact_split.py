"""Write a source GGUF again as a ``gguf-split`` set, the way gguf-py's writer splits a model.

The parts are what ``llama-gguf-split`` and gguf-py produce: the first carries every metadata
key, each carries ``split.no`` / ``split.count`` / ``split.tensors.count``, tensor bytes copied
unchanged, named ``STEM-0000N-of-0000M.gguf``.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from meshnet.artifact.gguf_file import GGML_BLOCKS, parse_gguf


def write_split_set(source: Path, folder: Path, max_tensors: int, stem: str = "model") -> list[Path]:
    """Write ``source`` as parts of at most ``max_tensors`` tensors under ``folder``; the part paths."""
    model = parse_gguf(source)
    folder.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(folder / f"{stem}.gguf", arch=model.architecture, split_max_tensors=max_tensors)
    for key, entry in model.metadata.items():
        if key == "general.architecture":
            continue
        sub_type = GGUFValueType(int(entry.item_type)) if entry.item_type is not None else None
        writer.add_key_value(key, entry.value, GGUFValueType(int(entry.type)), sub_type=sub_type)
    with open(source, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
        for info in model.tensors.values():
            start = model.data_offset + info.offset
            block, type_size = GGML_BLOCKS[info.ggml_type]
            byte_shape = (*reversed(info.shape[1:]), info.shape[0] // block * type_size)
            payload = np.frombuffer(view[start : start + info.nbytes], dtype=np.uint8).reshape(byte_shape)
            writer.add_tensor(info.name, payload, raw_dtype=GGMLQuantizationType(info.ggml_type))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return sorted(folder.glob(f"{stem}-*-of-*.gguf"))
