"""Two workers on one machine cutting the same slice at once: one cuts, the other waits and reuses it.

Without the lock both cut it and the second renames its copy over the file the first one has
already mapped (seen as an expert node whose weights were "not in its mapping" and refused to
serve, when two nodes of a group started together).
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest

from meshnet.artifact import cache as cache_module
from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.layers import LayerRange


def test_a_slice_being_cut_is_waited_for_not_cut_again(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write, real_exclusive = cache_module.write_slice, cache_module._exclusive
    calls: list[int] = []
    cutting, second_at_the_lock = threading.Event(), threading.Event()
    lockers: list[int] = []

    def noting_exclusive(path: Path) -> contextlib.AbstractContextManager[None]:
        lockers.append(threading.get_ident())
        if len(lockers) == 2:
            second_at_the_lock.set()
        return real_exclusive(path)

    def held_write(*args: object, **kwargs: object) -> object:
        calls.append(threading.get_ident())
        cutting.set()
        # The first cut goes on only once the second caller has come for the slice's lock.
        assert second_at_the_lock.wait(10), "the second caller never reached the slice's lock"
        return real_write(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cache_module, "write_slice", held_write)
    monkeypatch.setattr(cache_module, "_exclusive", noting_exclusive)
    n_layers = describe_model(tiny_model).n_layers
    whole = LayerRange(0, n_layers)
    cache = SliceCache(tmp_path / "cache")
    cache.source_sha256(tiny_model)  # hashed once up front: this test is about the slice
    inodes: list[int] = []

    def cut() -> None:
        files = SliceCache(tmp_path / "cache").shard_files(tiny_model, whole, n_layers)
        inodes.append(files.slice.stat().st_ino)

    first = threading.Thread(target=cut)
    first.start()
    assert cutting.wait(10)
    second = threading.Thread(target=cut)
    second.start()
    first.join(10)
    second.join(10)
    assert len(calls) == 1, "the second caller cut the slice again instead of waiting for the first"
    final = cache.shard_files(tiny_model, whole, n_layers).slice.stat().st_ino
    assert inodes == [final, final]
