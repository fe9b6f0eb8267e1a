"""The ``transformers`` extra lane: the design documents' baseline, measured beside llama.cpp.

It yields two results, each a ratio to whole-model llama.cpp (meshnet's engine, ``llama-whole``)
on the same prompts, greedy, the same thread count, in the same process:

- ``transformers-whole``: the full local PyTorch model with transformers' KV cache;
- ``transformers-recompute-N``: the documents' "distributed PyTorch route" over N stages (the
  recompute lane's split), every token recomputing the whole sequence with ``use_cache=False``.
  Its stages run in this process, where the documents' route runs one per node: the activation
  is still serialized and rebuilt at each seam, but no network is crossed, so the lane is an
  upper bound on that route's speed. It feeds token ids forward, where the documents' head
  re-tokenizes the growing text each step.

Token agreement is against llama.cpp's greedy tokens, per prompt: float32 dequantized weights
against quantized matmuls, so agreement is reported, not assumed. Without the ``baseline`` extra
both lanes are skipped with the reason.
"""

from __future__ import annotations

from contextlib import closing

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.bench.config import BenchConfig
from meshnet.bench.inprocess import CachedLane
from meshnet.bench.results import ExtraLane
from meshnet.bench.runner import Progress
from meshnet.bench.stats import RequestTrace, RunRecord, median, stream_decode_rate, token_agreement
from meshnet.bench.torch_baseline import BaselineModel, BaselineUnavailable, Generated
from meshnet.bench.workload import build_prompts
from meshnet.core.layers import split_evenly
from meshnet.engine.shards import open_local_route
from meshnet.engine.tokenizer import Tokenizer

WHOLE_LANE = "transformers-whole"
PROMPTS = 2
MAX_OUTPUT_TOKENS = 32
"""The recompute route re-runs the whole sequence per token: 32 tokens keep the lane to a minute."""
WARMUP_TOKENS = 2


def recompute_lane(stages: int) -> str:
    return f"transformers-recompute-{stages}"


def skipped_lanes(config: BenchConfig, reason: str) -> dict[str, ExtraLane]:
    return {name: _skipped(reason) for name in (WHOLE_LANE, recompute_lane(config.recompute_shards))}


def measure_transformers(config: BenchConfig, progress: Progress) -> dict[str, ExtraLane]:
    """Both transformers lanes, or each skipped with the reason it cannot run here. A failure
    inside either lane skips that lane only: the rest of the bench still writes its results."""
    output_tokens = min(config.output_tokens, MAX_OUTPUT_TOKENS)
    try:
        model = BaselineModel(config.model, config.threads)
    except BaselineUnavailable as error:
        progress(f"transformers: skipped: {error.message}")
        return skipped_lanes(config, error.message)
    except Exception as error:
        return skipped_lanes(config, _failure("transformers cannot load the model", error, progress))
    with closing(model):
        return _measure_loaded(model, config, output_tokens, progress)


def _measure_loaded(
    model: BaselineModel, config: BenchConfig, output_tokens: int, progress: Progress
) -> dict[str, ExtraLane]:
    stages = split_evenly(model.n_layers, config.recompute_shards)
    recompute_name = recompute_lane(len(stages))
    try:
        prompts, reference = llama_reference(config, output_tokens)
        progress(f"transformers: whole and {recompute_name} on {len(prompts)} prompt(s), {output_tokens} tokens")
        model.generate_cached(prompts[0], WARMUP_TOKENS)
        whole = [model.generate_cached(prompt, output_tokens) for prompt in prompts]
    except Exception as error:  # third-party code on any model: skip the lane, never abort the bench
        reason = _failure(f"{WHOLE_LANE} failed", error, progress)
        return {name: _skipped(reason) for name in (WHOLE_LANE, recompute_name)}
    workload = (
        f"{len(prompts)} prompt(s) of {config.prompt_tokens} tokens, {output_tokens} tokens greedy; {model.versions}"
    )
    lanes = {
        WHOLE_LANE: transformers_result(whole, reference, f"transformers KV-cached decode vs llama-whole, {workload}")
    }
    try:
        recompute = [model.generate_recompute(prompt, output_tokens, stages) for prompt in prompts]
    except BaselineUnavailable as error:
        progress(f"{recompute_name}: skipped: {error.message}")
        return {**lanes, recompute_name: _skipped(error.message)}
    except Exception as error:
        return {**lanes, recompute_name: _skipped(_failure(f"{recompute_name} failed", error, progress))}
    lanes[recompute_name] = transformers_result(
        recompute,
        reference,
        f"{len(stages)} in-process stages, use_cache=False, whole sequence per token, "
        f"{_seam_mib(recompute):.1f} MiB across seams per request; vs llama-whole, {workload}; "
        f"tokens equal to transformers-whole: {_agreement(recompute, whole):.3f}",
    )
    return lanes


def _failure(what: str, error: Exception, progress: Progress) -> str:
    reason = f"{what}: {type(error).__name__}: {error}"
    progress(f"transformers: skipped: {reason}")
    return reason


def _skipped(reason: str) -> ExtraLane:
    return ExtraLane(None, None, None, None, "", skipped=reason)


def llama_reference(config: BenchConfig, output_tokens: int) -> tuple[list[tuple[int, ...]], RunRecord]:
    """The bench's prompts and whole-model llama.cpp's greedy run of each, one at a time."""
    description = describe_model(config.model)
    with closing(Tokenizer(description)) as tokenizer:
        prompts = list(build_prompts(tokenizer, PROMPTS, config.prompt_tokens))
    llama = config.llama_config(max_slots=1)
    route = open_local_route(description, 1, SliceCache(config.data_dir / "cache"), llama)
    with closing(route):
        lane = CachedLane(route)
        lane.run(prompts[:1], [0], WARMUP_TOKENS)
        traces = [
            lane.run((prompt,), [index], output_tokens).record.requests[0] for index, prompt in enumerate(prompts)
        ]
    return prompts, RunRecord(1, traces[0].started, traces[-1].finished, tuple(traces))


def transformers_result(runs: list[Generated], reference: RunRecord, note: str) -> ExtraLane:
    record = as_record(runs)
    decode = median([r for r in map(stream_decode_rate, record.requests) if r is not None])
    whole = median([r for r in map(stream_decode_rate, reference.requests) if r is not None])
    expected = {trace.prompt_index: trace.tokens for trace in reference.requests if trace.error is None}
    per_prompt = tuple(
        agreement
        for trace in record.requests
        if (agreement := token_agreement([_solo(trace)], expected).token_agreement) is not None
    )
    return ExtraLane(
        decode_tok_s=decode,
        whole_decode_tok_s=whole,
        vs_whole=decode / whole if decode and whole else None,
        token_agreement=token_agreement([record], expected).token_agreement,
        note=note,
        token_agreement_per_prompt=per_prompt,
    )


def as_record(runs: list[Generated]) -> RunRecord:
    """Generations, one prompt each in order, as the bench's run record (prompt index = position)."""
    traces = tuple(
        RequestTrace(index, 0, run.started, run.token_times, run.tokens, run.token_times[-1])
        for index, run in enumerate(runs)
    )
    return RunRecord(1, runs[0].started, runs[-1].token_times[-1], traces)


def _solo(trace: RequestTrace) -> RunRecord:
    return RunRecord(1, trace.started, trace.finished, (trace,))


def _agreement(runs: list[Generated], reference: list[Generated]) -> float:
    expected = {index: run.tokens for index, run in enumerate(reference)}
    return token_agreement([as_record(runs)], expected).token_agreement or 0.0


def _seam_mib(runs: list[Generated]) -> float:
    return sum(run.seam_bytes for run in runs) / len(runs) / 2**20
