"""The llama.cpp backend: one context over one range slice, driven by one owner.

How a slice runs only its layers on stock llama.cpp (engine-notes.md):
- input is token ids (full shard) or embeddings in ``llama_batch.embd``: looked up by the head
  from the quantized table, or the previous shard's boundary residual; positions stay absolute;
- the boundary output is the tensor ``l_out-{n-1}`` read in the eval callback; every row is
  marked as an output on non-tail shards, or llama.cpp would prune the last layer to the output
  rows before ``l_out`` is formed;
- each session is one llama sequence id; one ``llama_decode`` carries several sessions' steps.
The batch arrays are NumPy buffers allocated once, so a decode step costs no Python allocation
beyond its outputs.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import numpy as np

from meshnet.artifact.embedding import EmbeddingTable
from meshnet.artifact.slicing import verify_slice
from meshnet.core.errors import EngineError, InvalidArgument, ResourceExhausted, SnapshotRefused
from meshnet.core.kv_type import KvType
from meshnet.engine.backend import ShardRole, ShardShape, StepInput, StepOutput, join_pieces, prefill_pieces
from meshnet.engine.batching import MatrixWeight, decode_calls, decode_rows_per_call
from meshnet.engine.call_costs import CallCosts, batched_from
from meshnet.engine.devices import device_handle
from meshnet.engine.kv_blob import KvOwner, restorable, seal, unseal
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.llama_ffi import EvalCallback, ggml_backend_tensor_get, ggml_get_name, ggml_nbytes
from meshnet.engine.native_capture import CaptureState, native_capture
from meshnet.engine.step_checks import check_batch

_ALL_LAYERS = 1 << 30
"""``n_gpu_layers`` past a model's layer count offloads every layer and the output."""
_GGML_KV_TYPES = {
    KvType.F16: llama_cpp.GGML_TYPE_F16,
    KvType.Q8_0: llama_cpp.GGML_TYPE_Q8_0,
    KvType.Q4_0: llama_cpp.GGML_TYPE_Q4_0,
}
"""ggml's type for each KV type (``llama_context_params.type_k`` / ``type_v``)."""
SPLIT_KV_FROM = 128
"""A one-token step from this position on runs on one thread (see ``_threads_for``): ggml's CPU
flash attention splits a lone query's KV across the threads once the KV view holds 512 cells
(more than 256 positions, padded), so its rounding would follow the thread count."""


class LlamaBackend:
    """Runs one range slice. Not thread-safe: exactly one owner calls it."""

    def __init__(self, slice_path: Path, config: LlamaConfig, *, embeddings: EmbeddingTable | None = None) -> None:
        model_file, provenance = verify_slice(slice_path)
        if provenance.role == "embedding":
            raise InvalidArgument(f"{Path(slice_path).name} is an embedding table, not a layer slice")
        role: ShardRole = provenance.role
        n_embd = int(model_file.require(f"{model_file.architecture}.embedding_length"))
        if role == "head" and embeddings is None:
            raise InvalidArgument("a head shard needs the embedding table to look token rows up")
        if embeddings is not None and embeddings.source_sha256 != provenance.source_sha256:
            raise InvalidArgument("the embedding table was cut from a different source model")
        self._embeddings = embeddings if role == "head" else None
        self._config = config
        # A shard that ends the model captures its final-norm rows (embeddings pool them); any
        # other, the residual after its last layer (the boundary the next shard takes).
        self._target = b"result_norm" if role in ("full", "tail") else f"l_out-{len(provenance.layers) - 1}".encode()
        self._model, self._ctx = self._load(Path(slice_path), config)
        n_vocab = (
            llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model))
            if role in ("full", "tail")
            else 0
        )
        self.provenance = provenance
        weights = [MatrixWeight(t.name, t.ggml_type, len(t.shape)) for t in model_file.tensors.values()]
        self._shape = ShardShape(
            provenance.layers,
            provenance.source_n_layers,
            n_embd,
            n_vocab,
            role,
            config.max_slots,
            config.n_ctx_per_slot,
            config.max_batch_tokens,
            decode_rows_per_call(weights, emits_logits=role in ("full", "tail"), max_slots=config.max_slots),
        )
        self._owner = KvOwner(provenance.source_sha256, provenance.layers)
        self._window = int(llama_cpp.llama_model_n_swa(self._model))
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._threads = config.n_threads
        self._allocate_batch(config.max_batch_tokens, n_embd)
        self.call_costs: CallCosts | None  # what this CPU charged for calls of 1-8 rows, where measured
        self._fewest_batched, self.call_costs = batched_from(weights, config, self._shape, self._decode, self.truncate)

    @property
    def shape(self) -> ShardShape:
        return self._shape

    # -- set-up -------------------------------------------------------------------------

    def _load(self, path: Path, config: LlamaConfig) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        self._place(model_params, config)
        # This llama.cpp chooses mmap through load_mode (AUTO maps on CPU); NONE reads into memory.
        if not config.use_mmap:
            model_params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
        model_params.use_extra_bufts = config.repack  # off: kernels read the weights where loaded
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not model:
            raise EngineError(f"llama.cpp could not load {path.name}")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = config.n_ctx_per_slot * config.max_slots
        params.n_batch = params.n_ubatch = config.max_batch_tokens
        params.n_seq_max = config.max_slots
        params.n_threads = params.n_threads_batch = config.n_threads
        # One KV stream per session: a unified cache reuses cells freed by other sessions, which
        # reorders a session's cells and so its attention sums (measured: logits moved by 0.6).
        params.kv_unified = False
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if config.flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.type_k = params.type_v = _GGML_KV_TYPES[config.kv_type]
        params.no_perf = True
        # llama.cpp would send a large batch's ops on CPU-held weights to a GPU: never on a CPU
        # recipe (it changes the arithmetic), and on a GPU recipe only as its certification ran.
        params.op_offload = config.device.is_gpu
        self._install_capture(params)
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            llama_cpp.llama_model_free(model)
            raise EngineError(f"llama.cpp could not create a context for {path.name}")
        return model, ctx

    def _place(self, model_params: llama_cpp.llama_model_params, config: LlamaConfig) -> None:
        """Put the owned layers on ``config.device``: a NULL-terminated list naming only it, so
        llama.cpp uses no other device (an empty list on the CPU: nothing is offloaded)."""
        device = config.device
        handles = [device_handle(device).value] if device.is_gpu else []
        # Kept on self: llama.cpp reads the list while loading the model.
        self._devices = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)
        # The binding declares the field an array it never fills; the C side reads a pointer.
        model_params.devices = ctypes.cast(self._devices, ctypes.c_void_p)  # type: ignore[assignment]
        model_params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_NONE
        model_params.main_gpu = 0
        model_params.n_gpu_layers = (
            0 if not device.is_gpu else config.gpu_layers if config.gpu_layers is not None else _ALL_LAYERS
        )

    def _install_capture(self, params: llama_cpp.llama_context_params) -> None:
        """Point the eval callback at the boundary tensor: in C when possible (see native_capture)."""
        native = native_capture()
        self._capture_state: CaptureState | None = None
        if native is not None:
            self._capture_state = CaptureState(target=self._target)
            self._callback = ctypes.cast(native.meshnet_capture_eval, EvalCallback)
            params.cb_eval = self._callback
            params.cb_eval_user_data = ctypes.cast(ctypes.pointer(self._capture_state), ctypes.c_void_p)
        else:
            # The callback object must outlive the context: keep it on self.
            self._callback = EvalCallback(self._on_eval)
            params.cb_eval = self._callback
            params.cb_eval_user_data = ctypes.c_void_p()

    def _allocate_batch(self, capacity: int, n_embd: int) -> None:
        self._tokens = np.zeros(capacity, np.int32)
        self._embd = np.zeros((capacity, n_embd), np.float32)
        self._pos = np.zeros(capacity, np.int32)
        self._n_seq = np.ones(capacity, np.int32)
        self._seq = np.zeros((capacity, 1), np.int32)
        self._want = np.zeros(capacity, np.int8)
        self._seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)(
            *[ctypes.cast(self._seq[i].ctypes.data, ctypes.POINTER(ctypes.c_int32)) for i in range(capacity)]
        )
        self._captured = np.zeros((capacity, n_embd), np.float32)
        self._captured_rows = 0
        self._positions = np.arange(capacity, dtype=np.int32)
        # The llama_batch over the buffers above for each kind of input, built once: a call only
        # sets its row count.
        self._batches = {uses_tokens: self._batch_over(uses_tokens) for uses_tokens in (True, False)}
        if self._capture_state is not None:
            self._capture_state.buffer = self._captured.ctypes.data
            self._capture_state.capacity = self._captured.nbytes

    def _batch_over(self, uses_tokens: bool) -> llama_cpp.llama_batch:
        return llama_cpp.llama_batch(
            n_tokens=0,
            token=self._pointer(self._tokens, ctypes.c_int32) if uses_tokens else None,
            embd=None if uses_tokens else self._pointer(self._embd, ctypes.c_float),
            pos=self._pointer(self._pos, ctypes.c_int32),
            n_seq_id=self._pointer(self._n_seq, ctypes.c_int32),
            seq_id=self._seq_ptrs,
            logits=self._pointer(self._want, ctypes.c_int8),
        )

    def _pointer(self, array: np.ndarray, kind: type) -> ctypes._Pointer:
        return ctypes.cast(array.ctypes.data, ctypes.POINTER(kind))

    # -- boundary capture ---------------------------------------------------------------

    def _on_eval(self, tensor: int, ask: bool, _user: int) -> bool:
        if ask:
            return bool(ggml_get_name(tensor) == self._target)
        if ggml_get_name(tensor) != self._target:
            return True
        nbytes = ggml_nbytes(tensor)
        row_bytes = self._captured.shape[1] * 4
        rows = nbytes // row_bytes
        if self._captured_rows + rows > self._captured.shape[0]:
            return False  # aborts the graph; reported as an engine error below
        destination = self._captured.ctypes.data + self._captured_rows * row_bytes
        ggml_backend_tensor_get(tensor, destination, 0, nbytes)
        self._captured_rows += rows
        return True

    # -- execution ----------------------------------------------------------------------

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        """Run every input, appending to each slot's KV; outputs come back in input order.

        Single-token steps of all sessions share one llama_decode call where that is exact for
        this shard's weight types (``engine/batching.py``), else each runs alone; a batch too
        small to be worth one call through this shard's LM head, as this CPU prices it
        (``call_costs``), runs one row per call (``batching.decode_calls``), which computes the same. Each
        multi-token input (a prefill chunk) runs in calls of its own: the CPU matmul kernels
        pick their path by row count, so mixing sessions' prefill rows would change a session's
        arithmetic.
        """
        self._validate(batch)
        # llama.cpp keeps rows of one sequence in order; sorting by slot also makes the
        # captured boundary rows come back in our row order for every split strategy.
        order = sorted(range(len(batch)), key=lambda i: batch[i].slot)
        pieces: dict[int, list[StepOutput]] = {i: [] for i in order}
        singles = [(i, batch[i]) for i in order if batch[i].n_tokens == 1]
        most = self._shape.rows_per_decode_call
        for call in decode_calls([step.slot for _, step in singles], most=most, fewest=self._fewest_batched):
            self._decode([singles[i] for i in call], pieces)
        for index in order:
            if batch[index].n_tokens > 1:
                for piece in prefill_pieces(batch[index], self._shape.max_batch_tokens):
                    self._decode([(index, piece)], pieces)
        return [join_pieces(pieces[i]) for i in range(len(batch))]

    def _decode(self, call: list[tuple[int, StepInput]], pieces: dict[int, list[StepOutput]]) -> None:
        row = 0
        spans = []
        for index, step in call:
            n = step.n_tokens
            if n == 1:
                self._pos[row] = step.position
            else:
                np.add(self._positions[:n], step.position, out=self._pos[row : row + n])
            self._seq[row : row + n, 0] = step.slot
            if self._shape.emits_logits:
                self._want[row : row + n] = 1 if step.want_logits == "all" else 0
                if step.want_logits == "last":
                    self._want[row + n - 1] = 1
            else:
                self._want[row : row + n] = 1  # keep every row: no pruning before l_out
            if step.tokens is not None and self._embeddings is None:
                self._tokens[row : row + n] = step.tokens
            else:
                self._embd[row : row + n] = (
                    self._embeddings.lookup(step.tokens) if step.tokens is not None else step.hidden  # type: ignore[union-attr]
                )
            spans.append((index, step, row))
            row += n
        self._threads_for(call)
        uses_tokens = call[0][1].tokens is not None and self._embeddings is None
        batch = self._batches[uses_tokens]
        batch.n_tokens = row
        self._captured_rows = 0
        if self._capture_state is not None:
            self._capture_state.used = 0
        status = llama_cpp.llama_decode(self._ctx, batch)
        if self._capture_state is not None:
            self._captured_rows = self._capture_state.used // (4 * self._shape.n_embd)
        if status == 1:
            raise ResourceExhausted("no KV cache room left for this batch on this shard")
        if status != 0:
            raise EngineError(f"llama_decode failed with status {status}")
        self._collect(spans, row, pieces)

    def _threads_for(self, call: list[tuple[int, StepInput]]) -> None:
        """One thread for a lone one-token step over a long KV, the configured ones otherwise.

        Past 256 positions ggml's CPU attention for a single query row cuts the KV into one part
        per thread and sums the parts (its split-KV path), so the step's logits would depend on
        the thread count: nodes with other ``--threads`` would compute other tokens, and the same
        step batched with another session's (which takes the per-row path) would differ from it
        alone (measured on SmolLM2 at 2 threads: 0.49 apart at 300 positions, equal at 1 thread).
        On one thread the split path is one part, which is the per-row path's arithmetic."""
        _, step = call[0]
        alone = len(call) == 1 and step.n_tokens == 1 and step.position >= SPLIT_KV_FROM
        threads = 1 if alone and not self._config.device.is_gpu else self._config.n_threads
        if threads != self._threads:
            llama_cpp.llama_set_n_threads(self._ctx, threads, self._config.n_threads)
            self._threads = threads

    def _collect(self, spans: list[tuple[int, StepInput, int]], rows: int, pieces: dict[int, list[StepOutput]]) -> None:
        if not self._shape.emits_logits:
            if self._captured_rows != rows:
                raise EngineError(
                    f"boundary capture saw {self._captured_rows} rows of {self._target.decode()} for {rows} "
                    "tokens: the pinned llama.cpp no longer matches the split engine's assumptions"
                )
            for index, step, row in spans:
                pieces[index].append(StepOutput(step.slot, hidden=self._captured[row : row + step.n_tokens].copy()))
            return
        n_vocab = self._shape.n_vocab
        n_out = int(self._want[:rows].sum())
        pointer = llama_cpp.llama_get_logits(self._ctx)
        logits = np.ctypeslib.as_array(pointer, shape=(n_out, n_vocab)) if n_out else np.zeros((0, n_vocab), np.float32)
        # The final-norm rows are exactly the output rows where the graph names result_norm.
        normed = self._captured if self._captured_rows == n_out else None
        out_row = 0
        for index, step, row in spans:
            count = int(self._want[row : row + step.n_tokens].sum())
            rows_normed = None if normed is None else normed[out_row : out_row + count].copy()
            # An embedding reads only the final-norm rows: its rows x n_vocab logits stay unread.
            rows_logits = logits[out_row : out_row + count].copy() if step.read_logits else None
            pieces[index].append(StepOutput(step.slot, logits=rows_logits, normed=rows_normed))
            out_row += count

    def _validate(self, batch: list[StepInput]) -> None:
        vocab = self._embeddings.n_vocab if self._embeddings is not None else self._shape.n_vocab
        check_batch(batch, self._shape, vocab)
        for step in batch:
            expected = llama_cpp.llama_memory_seq_pos_max(self._memory, step.slot) + 1
            if step.position != expected:
                raise InvalidArgument(f"slot {step.slot} is at position {expected}, input starts at {step.position}")

    def truncate(self, slot: int, position: int) -> None:
        if not 0 <= slot < self._shape.max_slots or position < 0:
            raise InvalidArgument(f"cannot truncate slot {slot} at {position}")
        llama_cpp.llama_memory_seq_rm(self._memory, slot, position, -1)

    def export_slot(self, slot: int) -> bytes:
        # llama.cpp's per-sequence state: the slot's cells of every owned layer (and, under a
        # sliding window, of the window cache as it stands), sealed with whose KV it is.
        if not 0 <= slot < self._shape.max_slots:
            raise InvalidArgument(f"cannot export slot {slot}")
        size = llama_cpp.llama_state_seq_get_size(self._ctx, slot)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, slot)
        if written == 0:
            raise EngineError(f"llama.cpp could not export the KV of slot {slot}")
        return seal(self._owner, self.slot_length(slot), bytes(memoryview(buffer)[:written]))

    def import_slot(self, slot: int, blob: bytes, tokens: int) -> None:
        if not 0 <= slot < self._shape.max_slots or not 0 < tokens <= self._shape.n_ctx_per_slot:
            raise InvalidArgument(f"cannot import {tokens} positions into slot {slot}")
        llama_cpp.llama_memory_seq_rm(self._memory, slot, 0, -1)
        # Checked before llama.cpp sees it: llama.cpp trusts the cells' positions (kv_blob).
        state = restorable(unseal(self._owner, tokens, blob), tokens, self._window)
        # llama.cpp only reads the buffer: it is passed where the bytes lie, not copied.
        data = ctypes.cast(ctypes.c_char_p(state), ctypes.POINTER(ctypes.c_uint8))
        read = llama_cpp.llama_state_seq_set_data(self._ctx, data, len(state), slot)
        held = self.slot_length(slot)
        if read != len(state) or held != tokens:
            llama_cpp.llama_memory_seq_rm(self._memory, slot, 0, -1)
            raise SnapshotRefused(
                f"llama.cpp did not load the KV state ({read} of {len(state)} bytes read, {held} positions "
                f"where {tokens} were expected): it is not a state of this shard's layers"
            )

    def graphs_reused(self) -> int:
        """How many llama_decode calls so far reused the previous call's compute graph instead of
        building one (llama.cpp's own count; it reuses only for the same rows, sessions and KV
        view size): a diagnostic of what a batching pattern costs (``scripts/decode_waves``)."""
        return int(llama_cpp.llama_perf_context(self._ctx).n_reused)

    def slot_length(self, slot: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self._memory, slot)) + 1

    def close(self) -> None:
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None  # type: ignore[assignment]
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None  # type: ignore[assignment]
