"""The served model id: a gguf-split set is named by its first part however it is given."""

from __future__ import annotations

from pathlib import Path

from meshnet.artifact.model_id import served_model_id


def test_a_set_given_as_its_directory_is_named_by_its_first_part(tmp_path: Path) -> None:
    folder = tmp_path / "downloads"
    folder.mkdir()
    for number in (1, 2):
        (folder / f"Big-Model-Q4_0-0000{number}-of-00002.gguf").write_bytes(b"")
    first = folder / "Big-Model-Q4_0-00001-of-00002.gguf"
    assert served_model_id(folder) == served_model_id(first) == "Big-Model-Q4_0"
    assert served_model_id(folder, "published") == "published"
