"""Content hashes for artifacts: whole files and the tensor section of slices."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

CHUNK = 1 << 22


def file_sha256(path: Path, progress: Callable[[int, int], None] | None = None) -> str:
    """sha256 of a whole file, reporting ``(done_bytes, total_bytes)`` as it goes."""
    digest = hashlib.sha256()
    total = Path(path).stat().st_size
    done = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    return digest.hexdigest()


def set_sha256(parts: Sequence[Path], progress: Callable[[int, int], None] | None = None) -> str:
    """Identity of a ``gguf-split`` set: a hash over each part's sha256, in part order.

    It differs from every single part's hash and from the unsplit file's: the parts' bytes are
    not the unsplit file's (split keys, offsets), and proving their tensors equal would mean
    reading both. So a set and an unsplit file are two sources; slices carry the identity they
    were cut from and a route never mixes the two."""
    total = sum(Path(part).stat().st_size for part in parts)
    digest = hashlib.sha256(f"gguf-split|{len(parts)}\n".encode())
    done = 0
    for number, part in enumerate(parts):
        base = done
        report = None if progress is None else (lambda d, _t, base=base: progress(base + d, total))
        digest.update(f"{number}|{file_sha256(part, report)}\n".encode())
        done += Path(part).stat().st_size
    return digest.hexdigest()


def tensors_sha256(entries: Iterable[tuple[str, int, tuple[int, ...], memoryview | bytes]]) -> str:
    """Hash of a slice's tensors: name, ggml type, shape and bytes of each, in file order.

    Computed the same way when writing (from the source bytes) and when loading (from the slice's
    own bytes), so any change to a tensor's identity or contents shows.
    """
    digest = hashlib.sha256()
    for name, ggml_type, shape, payload in entries:
        digest.update(f"{name}|{ggml_type}|{','.join(map(str, shape))}|{len(payload)}\n".encode())
        digest.update(payload)
    return digest.hexdigest()


def partial_path(target: Path) -> Path:
    """A private temporary name next to ``target`` for an atomic write-then-rename.

    Unique per writer, so two processes cutting the same file at once (two workers started
    together on one machine) never write into each other's half-finished file.
    """
    target = Path(target)
    return target.with_name(f"{target.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
