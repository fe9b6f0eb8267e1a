"""The one loop that owns a backend: a thread fed by a queue, never a lock around a context.

Asyncio handlers submit steps and await futures; the loop thread drains its inbox, asks the
pure scheduler what to run, runs one batch through the backend and resolves the futures.
llama.cpp calls release the GIL, so the event loop keeps serving the network meanwhile.
A prefill longer than one chunk advances one chunk per tick, interleaved with decode batches.

The backend is created, used and closed on the loop's own thread: llama.cpp's OpenMP thread
teams belong to the thread that calls it, and driving one context from several threads at once
measured 1.4x slower decode (a second team competing for the cores). The one exception is
``inline_decode``: a decode step that would run alone in the next tick anyway (a single stream;
``scheduler.runs_inline``) runs at once on the event loop's thread while the loop thread is idle,
under the lock the loop thread holds whenever it touches the backend. Its two hand-offs
through the queue cost 0.3 ms a step on a shard whose threads share a core (measured with a
per-step trace); a single stream's step waits for nothing else, so nothing is lost by blocking
the event loop for its one llama.cpp call (which releases the GIL, so gRPC's own threads go on).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from meshnet.core.errors import Cancelled, DeadlineExceeded, EngineError, InvalidArgument, MeshnetError
from meshnet.engine.backend import Backend, StepInput, StepOutput, join_pieces, prefill_pieces
from meshnet.session.arrivals import Arrivals
from meshnet.session.loop_items import Call, LoopStats, Settled, Truncate, Work, resolve_all
from meshnet.session.scheduler import (
    GatherPolicy,
    PendingWork,
    gather_wait,
    gathers,
    nothing_to_gather,
    pipeline_waves,
    plan_tick,
    runs_inline,
    slot_waves,
    wave_size,
    window_length,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineLoop:
    def __init__(
        self,
        open_backend: Callable[[], Backend],
        *,
        max_decode_batch: int = 64,
        gather: GatherPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        inline_decode: bool = False,
    ) -> None:
        self._open_backend = open_backend
        self._max_decode_batch = max_decode_batch
        self._gather = GatherPolicy() if gather is None else gather
        self._decode_call_s = 0.0
        """Moving average of the decode calls' duration (sizes the gather window)."""
        self._arrivals = Arrivals(self._gather)
        self._clock = clock
        self._inbox: queue.SimpleQueue[Work | Truncate | Call | None] = queue.SimpleQueue()
        self._pending: list[Work] = []
        self._tickets = 0
        self._thread: threading.Thread | None = None
        self._backend: Backend | None = None
        self._inline = inline_decode
        """Lone decode steps may run on the caller's thread (only for a backend that does no I/O
        of its own in ``run``: blocking the event loop must not block what the step waits for)."""
        self._using_backend = threading.Lock()
        """Held by whichever thread runs the backend or changes the pending work."""
        self._settled: list[Settled] = []
        """Results the loop thread hands back once it lets go of the lock (``_holding``): handed
        back inside it, the caller's next lone step could find the lock still taken and queue."""
        self.stats = LoopStats()

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise EngineError("the engine loop has not started")
        return self._backend

    def start(self) -> Backend:
        """Start the thread, open the backend on it and return it (blocking; raises its error)."""
        opened: concurrent.futures.Future[Backend] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(opened,), name="meshnet-engine", daemon=True)
        self._thread.start()
        self._backend = opened.result()
        return self._backend

    def stop(self) -> None:
        """Stop the thread; it fails queued work and closes the backend on its way out."""
        if self._thread is not None:
            self._inbox.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    @property
    def queue_depth(self) -> int:
        return self.stats.queue_depth + self._inbox.qsize()

    # -- asyncio side -------------------------------------------------------------------

    async def run_step(self, step: StepInput, *, deadline: float | None = None) -> StepOutput:
        """Run one session's input (any length); resolves when every chunk has run."""
        if self._inline and step.n_tokens == 1:
            output = self._run_inline(step, deadline)
            if output is not None:
                return output
        output, _ = await self._submit(step, deadline, None)
        return output

    async def run_exporting(
        self, step: StepInput, export_at: int, *, deadline: float | None = None
    ) -> tuple[StepOutput, bytes | None]:
        """``run_step``, and the slot's KV exported the moment it reaches ``export_at``: an
        absolute multiple of the prefill chunk within the step, so a piece boundary (or its start).
        None instead of the KV when the export failed (the step itself ran: only reuse is lost)."""
        end = step.position + step.n_tokens
        if not step.position <= export_at <= end or export_at % self.backend.shape.max_batch_tokens:
            raise InvalidArgument(f"cannot export at {export_at} during positions {step.position}..{end}")
        if export_at == step.position:
            blob: bytes | None = None
            try:
                blob = await self.call(lambda backend: backend.export_slot(step.slot))
            except MeshnetError as error:
                log.warning("could not keep the KV of slot %d: %s", step.slot, error)
            return await self.run_step(step, deadline=deadline), blob
        return await self._submit(step, deadline, export_at)

    async def _submit(
        self, step: StepInput, deadline: float | None, export_at: int | None
    ) -> tuple[StepOutput, bytes | None]:
        future: asyncio.Future[StepOutput] = asyncio.get_running_loop().create_future()
        self._tickets += 1
        chunk = self.backend.shape.max_batch_tokens
        work = Work(self._tickets, step, deadline, self._clock(), future, prefill_pieces(step, chunk))
        work.export_at = export_at
        self._inbox.put(work)
        output = await future
        return output, work.exported

    async def call(self, function: Callable[[Backend], T]) -> T:
        """Run ``function(backend)`` on the loop thread between ticks."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._inbox.put(Call(function, future))
        return await future

    async def truncate(self, slot: int, position: int = 0) -> None:
        """Drop ``slot``'s KV from ``position`` on; queued work of that slot fails as Cancelled."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.put(Truncate(slot, position, future))
        await future

    def _run_inline(self, step: StepInput, deadline: float | None) -> StepOutput | None:
        """Run a lone decode step here and now; None when it must queue (see ``runs_inline``)."""
        if not self._using_backend.acquire(blocking=False):
            return None  # the loop thread is running a batch: join the queue
        try:
            if not self._inline:
                return None  # stopped meanwhile
            queued = len(self._pending) + (0 if self._inbox.empty() else 1)
            seen = list(self._arrivals.last)
            if not runs_inline(1, queued=queued, slot=step.slot, sessions_seen=seen, decode_call_s=self._decode_call_s):
                return None
            if deadline is not None and deadline <= self._clock():
                self.stats.expired += 1
                raise DeadlineExceeded("the step's deadline passed before it could run")
            self._arrivals.note(step.slot, time.monotonic(), step.route_shards)
            return self._run_backend([step])[0]
        finally:
            self._using_backend.release()

    # -- loop thread --------------------------------------------------------------------

    def _run(self, opened: concurrent.futures.Future[Backend]) -> None:
        try:
            backend = self._open_backend()
        except BaseException as error:
            opened.set_exception(error)
            return
        self._backend = backend
        opened.set_result(backend)
        try:
            while True:
                if not self._drain(block=not self._pending):
                    break
                if not self._pending:
                    continue  # woke with nothing to do: leave the lock to lone steps
                with self._holding():
                    wait = self._gather_wait()
                    if wait <= 0:
                        self._tick()
                # Let the other decoding sessions' steps join this tick (see GatherPolicy).
                if wait > 0 and not self._drain(block=True, timeout=wait):
                    break
        finally:
            with self._holding():
                self._inline = False  # nothing runs on a closed backend
                for work in self._pending:
                    self._settle(work.future, error=Cancelled("the shard is shutting down"))
                backend.close()

    def _drain(self, *, block: bool, timeout: float = 0.5) -> bool:
        """Move inbox items to pending (truncates run at once); False when told to stop."""
        try:
            item = self._inbox.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return True
        with self._holding():
            return self._apply_all(item)

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """The backend lock, for the loop thread; the results it settled go out after release."""
        self._using_backend.acquire()
        try:
            yield
        finally:
            self._using_backend.release()
            settled, self._settled = self._settled, []
            resolve_all(settled)

    def _settle(self, future: asyncio.Future[Any], *, value: Any = None, error: BaseException | None = None) -> None:
        self._settled.append((future, value, error))

    def _apply_all(self, item: Work | Truncate | Call | None) -> bool:
        while True:
            if item is None:
                return False
            if isinstance(item, Truncate):
                self._apply_truncate(item)
            elif isinstance(item, Call):
                self._apply_call(item)
            else:
                self._pending.append(item)
                if item.step.n_tokens == 1:
                    self._arrivals.note(item.step.slot, item.arrived, item.step.route_shards)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _gather_wait(self) -> float:
        shape = self.backend.shape
        if shape.max_decode_rows <= 1 or not gathers(takes_tokens=shape.takes_tokens, emits_logits=shape.emits_logits):
            return 0.0  # steps run one per call here anyway, or this shard is a stage of a pipeline
        if nothing_to_gather(len(self._pending), len(self._arrivals.last)):
            return 0.0  # a single stream: nothing else to wait for
        now = time.monotonic()
        decode = [w for w in self._pending if w.next_piece.n_tokens == 1]
        if not decode:
            return 0.0
        deadlines = [w.deadline for w in decode if w.deadline is not None]
        arrivals = [w.arrived for w in decode]
        until = min(arrivals) + window_length(self._gather, self._decode_call_s)
        ready = {w.step.slot for w in decode}
        expected = self._arrivals.expected(ready, until=until, now=now)
        return gather_wait(
            arrivals,
            min(expected, self._max_decode_batch),
            prefill_waiting=len(decode) < len(self._pending),
            # Deadlines are on the loop's clock: compare them there.
            earliest_deadline=None if not deadlines else now + (min(deadlines) - self._clock()),
            now=now,
            policy=self._gather,
            decode_call_s=self._decode_call_s,
        )

    def _apply_truncate(self, item: Truncate) -> None:
        if item.position == 0:
            self._arrivals.release(item.slot)
        for work in [w for w in self._pending if w.step.slot == item.slot]:
            self._pending.remove(work)
            self._settle(work.future, error=Cancelled("the session was released"))
        try:
            self.backend.truncate(item.slot, item.position)
            self._settle(item.future, value=None)
        except MeshnetError as error:
            self._settle(item.future, error=error)

    def _apply_call(self, item: Call) -> None:
        try:
            self._settle(item.future, value=item.function(self.backend))
        except Exception as error:
            self._settle(item.future, error=error)

    def _tick(self) -> None:
        now = self._clock()
        by_ticket = {w.ticket: w for w in self._pending}
        size, waves = self._decode_waves()
        pending = [
            PendingWork(w.ticket, w.next_piece.n_tokens, w.enqueued_at, w.deadline, w.step.slot) for w in self._pending
        ]
        # A partial wave's steps are passed over for two decode calls at most (``next_wave``).
        plan = plan_tick(pending, now=now, max_decode_batch=size, waves=waves, hold_s=2.0 * self._decode_call_s)
        for ticket in plan.expired:
            work = by_ticket[ticket]
            self._pending.remove(work)
            self.stats.expired += 1
            self._settle(work.future, error=DeadlineExceeded("the step's deadline passed before it could run"))
        running = [by_ticket[t] for t in plan.run]
        self.stats.queue_depth = len(self._pending) - len(running)
        if not running:
            return
        chunks = [w.next_piece for w in running]
        try:
            outputs = self._run_backend(chunks)
        except MeshnetError as error:
            self._fail(running, error)
            return
        for work, output in zip(running, outputs, strict=True):
            piece = work.next_piece
            work.outputs.append(output)
            if work.export_at is not None and piece.position + piece.n_tokens == work.export_at:
                try:
                    work.exported = self.backend.export_slot(piece.slot)
                except MeshnetError as error:
                    log.warning("could not keep the KV of slot %d: %s", piece.slot, error)
            if len(work.outputs) == len(work.pieces):
                self._pending.remove(work)
                self._settle(work.future, value=join_pieces(work.outputs))

    def _decode_waves(self) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """The most decode steps this tick runs and, on a route's head, the slots of each wave
        (``wave_size``, ``slot_waves``); elsewhere no waves: every ready step runs."""
        shape = self.backend.shape
        longest = self._arrivals.longest_route()
        waves = pipeline_waves(takes_tokens=shape.takes_tokens, emits_logits=shape.emits_logits, route_shards=longest)
        size = wave_size(self._max_decode_batch, len(self._arrivals.last), waves)
        return size, (slot_waves(self._arrivals.last, size) if waves > 1 else ())

    def _run_backend(self, chunks: list[StepInput]) -> list[StepOutput]:
        """One backend call, counted; its failures are typed (whichever thread holds the lock)."""
        started = time.perf_counter()
        try:
            outputs = self.backend.run(chunks)
        except MeshnetError:
            raise
        except Exception as error:  # a bug in the engine must not kill the loop or hang callers
            log.exception("engine batch failed")
            raise EngineError(f"engine failure: {error}") from error
        self._account(chunks, time.perf_counter() - started)
        return outputs

    def _fail(self, running: list[Work], error: MeshnetError) -> None:
        for work in running:
            self._pending.remove(work)
            self._settle(work.future, error=error)

    def _account(self, chunks: list[StepInput], seconds: float) -> None:
        stats = self.stats
        stats.busy_seconds += seconds
        decode = sum(1 for c in chunks if c.n_tokens == 1)
        if decode:
            # Seeded by the first call, so a slow shard is known as slow from its second step on.
            previous = self._decode_call_s
            self._decode_call_s = seconds if previous == 0.0 else 0.8 * previous + 0.2 * seconds
            stats.decode_batches += 1
            stats.decode_steps += decode
        stats.prefill_tokens += sum(c.n_tokens for c in chunks if c.n_tokens > 1)
