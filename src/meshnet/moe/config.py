"""What an expert node and a group front read of their worker's configuration.

Both run inside ``meshnet worker`` and take its ``node.config.WorkerConfig``; the feature names
only the settings it reads, as protocols, so the node package can build on this one (its
assembly serves a front) without this one importing it back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe.ownership import ExpertOwnership


class NumericsSettings(Protocol):
    """The settings that fix a recipe's arithmetic: every node of a group and its front agree."""

    @property
    def prefill_chunk(self) -> int: ...

    @property
    def flash_attn(self) -> bool: ...

    @property
    def repack(self) -> bool: ...


class FrontSettings(NumericsSettings, Protocol):
    """A worker that fronts a group (``--expert-group``)."""

    @property
    def layers(self) -> LayerRange: ...

    @property
    def expert_group(self) -> tuple[str, ...]: ...


class ExpertNodeSettings(NumericsSettings, Protocol):
    """A worker that is node I of a group (``--experts I/N``)."""

    @property
    def experts(self) -> ExpertOwnership | None: ...

    @property
    def expert_peers(self) -> tuple[str, ...]: ...

    @property
    def model(self) -> Path | None: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def expert_timeout(self) -> float: ...

    @property
    def expert_cache_mb(self) -> float | None: ...

    @property
    def max_sessions(self) -> int: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def tracker(self) -> str | None: ...

    def llama_config(self, max_sessions: int) -> LlamaConfig: ...
