"""An 8-turn chat through ``meshnet up``, each turn resending the whole history: time to the
first token per turn with prompt KV reuse on and off, and the texts of both (they must match).

    python scripts/bench_multiturn.py [--model PATH] [--chunks 64 256] [--think 0 3] [--out ...]

For each prefill chunk in ``--chunks``, ``meshnet up`` (3 shards, mTLS, as a new user runs it)
is started with ``--prefix-cache-mb 256`` once per reading time in ``--think`` (seconds between
an answer and the next question: the time a turn's warm-up has, ``route.warmup``) and once with
0 (no reuse); the same conversation is streamed through its OpenAI API (temperature 0,
``stream_options.include_usage``), the assistant's answer appended to the history each turn.
TTFT is from sending the request to the first content delta. Ratios (turn 8 over turn 1) are
within one run of ``up``: no comparison across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from meshnet.deploy.launch.ready_lines import UpLine

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEM = "You are a careful assistant helping an engineer plan a small distributed inference cluster."
TOPICS = (
    "the network between three old laptops in one flat, one of them on wifi",
    "how to split a model's layers when one machine has twice the memory of the others",
    "what to do when the middle machine goes to sleep in the middle of an answer",
    "how to keep prompts private when the machines belong to different friends",
    "how to measure which machine is the slowest without trusting what it says",
    "how long conversations change the memory each machine needs",
    "whether a GPU in one machine helps when the others only have CPUs",
    "what the first week of running such a cluster should look like",
)
MAX_TOKENS = 32
TELEMETRY = ": telemetry "
BETWEEN_CONVERSATIONS_S = 10.0


def _message(turn: int) -> str:
    """About a hundred tokens of question, different each turn."""
    topic = TOPICS[turn % len(TOPICS)]
    return (
        f"Question {turn + 1}. I would like your view on {topic}. Please think about the trade-offs, "
        "the failure modes a beginner would not expect, what to measure before deciding, and what "
        "you would try first on a quiet weekend with no budget for new hardware. Keep the answer "
        "short and concrete, with one example from a real home setup if you can."
    )


def _start_up(model: Path, data_dir: Path, port: int, chunk: int, cache_mb: float) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "meshnet", "up", "--data-dir", str(data_dir), "--model", str(model),
        "--shards", "3", "--port", str(port), "--max-tokens", "4", "--prompt", "hi",
        "--prefill-chunk", str(chunk), "--prefix-cache-mb", str(cache_mb),
        "--context", "2048",  # the committed figures' context (up now defaults to the trained length)
    ]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    for line in child.stdout or ():
        if UpLine.PREFIX in line:
            return child
        if time.monotonic() > deadline:
            break
    child.kill()
    raise RuntimeError(f"meshnet up did not become ready (exit {child.poll()})")


def _turn(client: httpx.Client, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    first: float | None = None
    text, usage, seen = "", {}, {}
    with client.stream("POST", "/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(TELEMETRY):
                event = json.loads(line[len(TELEMETRY) :])
                seen.setdefault(event["kind"], event)
                continue
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", ()):
                piece = choice.get("delta", {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter()
                text += piece
    return {
        "ttft_s": None if first is None else first - sent,
        "total_s": time.perf_counter() - sent,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens"),
        # Where the time to the first token went, from the gateway's own telemetry: until the
        # route was accepted (queue, a warm-up of this history, the tracker, the KV probe),
        # then the prefill on the route.
        "accepted_at_s": seen.get("accepted", {}).get("at"),
        "prefill_s": seen.get("prefill_completed", {}).get("seconds"),
        "text": text,
    }


def _conversation(port: int, data_dir: Path, think_s: float, run: int) -> list[dict[str, Any]]:
    key = (data_dir / "api-key").read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", headers=headers, timeout=600) as client:
        model = client.get("/models").json()["data"][0]["id"]
        messages = [{"role": "system", "content": f"{SYSTEM} (Conversation {run + 1}.)"}]
        turns = []
        for turn in range(len(TOPICS)):
            if turn:
                time.sleep(think_s)
            messages.append({"role": "user", "content": _message(turn)})
            result = _turn(client, model, messages)
            messages.append({"role": "assistant", "content": result["text"]})
            turns.append(result)
        return turns


def _lane(model: Path, chunk: int, cache_mb: float, think_s: float, options: argparse.Namespace) -> dict[str, Any]:
    """The conversation ``--repeats`` times on one ``up``; the ratio of the per-turn medians."""
    with tempfile.TemporaryDirectory(prefix="meshnet-multiturn-") as raw:
        data_dir = Path(raw)
        child = _start_up(model, data_dir, options.port, chunk, cache_mb)
        try:
            # Each repeat adds its run's number to the system prompt: nothing of one is reused by
            # the next; a pause between them lets the last turn's warm-up end first.
            repeats = []
            for run in range(options.repeats):
                time.sleep(BETWEEN_CONVERSATIONS_S if run else 0.0)
                repeats.append(_conversation(options.port, data_dir, think_s, run))
        finally:
            child.terminate()
            child.wait(timeout=60)
    medians = [statistics.median(run[turn]["ttft_s"] for run in repeats) for turn in range(len(TOPICS))]
    return {
        "prefill_chunk": chunk,
        "prefix_cache_mb": cache_mb,
        "think_s": think_s,
        "turns": repeats[0],
        "repeats": repeats[1:],
        "ttft_median_s": medians,
        "ttft_turn8_over_turn1": medians[-1] / medians[0],
        "prompt_growth": repeats[0][-1]["prompt_tokens"] / repeats[0][0]["prompt_tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--think", type=float, nargs="+", default=[0.0, 5.0])
    parser.add_argument("--repeats", type=int, default=3, help="conversations per lane (medians per turn)")
    parser.add_argument("--port", type=int, default=18089)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "multiturn.json")
    options = parser.parse_args()
    lanes = []
    for chunk in options.chunks:
        plan = [(256.0, think) for think in options.think] + [(0.0, 0.0)]
        runs = [_lane(options.model, chunk, cache_mb, think, options) for cache_mb, think in plan]
        cold = [t["text"] for t in runs[-1]["turns"]]
        for lane in runs:
            lane["texts_equal_cache_off"] = [t["text"] for t in lane["turns"]] == cold
            ttft = [round(t, 3) for t in lane["ttft_median_s"]]
            print(chunk, lane["prefix_cache_mb"], lane["think_s"], ttft, lane["ttft_turn8_over_turn1"])
        lanes += runs
    result = {
        "bench": "multiturn",
        "model": options.model.name,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "lanes": lanes,
    }
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
