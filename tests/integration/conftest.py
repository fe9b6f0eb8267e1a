"""Fixtures most swarm tests share: the tiny synthetic model and its in-process whole-model oracle.

Module-scoped, as each test module starts its own swarm; a module that needs another model
defines its own ``model`` fixture, which overrides this one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_harness import Reference, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[Reference]:
    ref = Reference(model, tmp_path_factory.mktemp("reference-cache"))
    yield ref
    ref.close()
