"""An expert-parallel group inside one process: N nodes as N threads, rows swapped in memory.

This is the reference group for certification, tests and ``meshnet generate --expert-parallel``
on one machine: the same backends and callback a networked group runs, with the exchange
replaced by a board that every node posts to and reads from. ``ExpertGroup`` is a ``Backend``,
so a ``LocalRoute`` of one group generates text as a whole model does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from meshnet.core.errors import DeadlineExceeded, EngineError, MeshnetError, Unavailable
from meshnet.engine.backend import KeepsNoKv, ShardShape, StepInput, StepOutput
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe.backend import ExpertParallelBackend, RowExchange
from meshnet.moe.ownership import ExpertOwnership, SlotRows

Codec = Callable[[SlotRows], SlotRows]
"""What a posted frame goes through on its way to the board (identity, or encode + decode)."""


class MemoryExchangeBoard:
    """Rows of every node per exchange sequence number; a node's ``exchange`` waits for all."""

    def __init__(self, group_size: int, timeout_s: float = 60.0, codec: Codec | None = None) -> None:
        self._size = group_size
        self._timeout_s = timeout_s
        self._codec = codec
        self._board: dict[int, dict[int, SlotRows]] = {}
        self._taken: dict[int, int] = {}
        self._failure: MeshnetError | None = None
        self._changed = threading.Condition()

    def endpoint(self, node: int) -> RowExchange:
        return _BoardEndpoint(self, node)

    def post_and_collect(self, node: int, rows: SlotRows) -> list[SlotRows]:
        posted = self._codec(rows) if self._codec is not None else rows
        with self._changed:
            self._raise_failure()
            self._board.setdefault(rows.sequence, {})[node] = posted
            self._changed.notify_all()
            complete = self._changed.wait_for(
                lambda: self._failure is not None or len(self._board[rows.sequence]) == self._size, self._timeout_s
            )
            self._raise_failure()
            if not complete:
                raise DeadlineExceeded(f"expert rows of exchange {rows.sequence} did not all arrive in time")
            entry = self._board[rows.sequence]
            others = [entry[sender] for sender in sorted(entry) if sender != node]
            self._taken[rows.sequence] = self._taken.get(rows.sequence, 0) + 1
            if self._taken[rows.sequence] == self._size:
                del self._board[rows.sequence], self._taken[rows.sequence]
            return others

    def abort(self, reason: MeshnetError) -> None:
        with self._changed:
            if self._failure is None:
                self._failure = Unavailable(f"a node of the expert group failed: {reason.message}")
            self._changed.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


class _BoardEndpoint:
    def __init__(self, board: MemoryExchangeBoard, node: int) -> None:
        self._board = board
        self._node = node

    def exchange(self, rows: SlotRows) -> list[SlotRows]:
        return self._board.post_and_collect(self._node, rows)

    def abort(self, reason: MeshnetError) -> None:
        self._board.abort(reason)


class ExpertGroup(KeepsNoKv):
    """N expert-parallel nodes driven together: every ``run`` runs on all of them at once.

    Each node computes the whole backbone, so every node's logits are the group's; they are
    compared anyway, as a cheap check that the nodes stayed in step."""

    def __init__(self, nodes: list[ExpertParallelBackend]) -> None:
        if not nodes:
            raise EngineError("an expert group needs at least one node")
        self.nodes = nodes
        self._pool = ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="expert-node")

    @classmethod
    def open(
        cls,
        model_path: Path,
        config: LlamaConfig,
        group_size: int,
        codec: Codec | None = None,
        expert_cache_bytes: int | None = None,
    ) -> ExpertGroup:
        board = MemoryExchangeBoard(group_size, codec=codec)
        nodes: list[ExpertParallelBackend] = []
        try:
            for index in range(group_size):
                ownership = ExpertOwnership(index, group_size)
                endpoint = board.endpoint(index)
                nodes.append(
                    ExpertParallelBackend(
                        model_path, config, ownership, endpoint, expert_cache_bytes=expert_cache_bytes
                    )
                )
        except BaseException:
            for node in nodes:
                node.close()
            raise
        return cls(nodes)

    @property
    def shape(self) -> ShardShape:
        return self.nodes[0].shape

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        futures = [self._pool.submit(node.run, batch) for node in self.nodes]
        results: list[list[StepOutput]] = []
        failures: list[MeshnetError] = []
        for future in futures:
            try:
                results.append(future.result())
            except MeshnetError as error:
                failures.append(error)
        if failures:
            # The first node's own error, not the peers' "a node failed" echoes, says why.
            primary = [f for f in failures if not isinstance(f, Unavailable)]
            raise (primary or failures)[0]
        first = results[0]
        for other in results[1:]:
            for mine, theirs in zip(first, other, strict=True):
                if not _same_bits(mine.logits, theirs.logits):
                    raise EngineError("the nodes of an expert group computed different logits")
        return first

    def truncate(self, slot: int, position: int) -> None:
        for node in self.nodes:
            node.truncate(slot, position)

    def slot_length(self, slot: int) -> int:
        return self.nodes[0].slot_length(slot)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for node in self.nodes:
            node.close()


def _same_bits(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool((a.view(np.uint32) == b.view(np.uint32)).all())
