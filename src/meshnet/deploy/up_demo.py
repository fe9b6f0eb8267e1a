"""`meshnet up`'s demo: one answer streamed to the terminal with its live telemetry, a line per event."""

from __future__ import annotations

import json
import sys

import httpx

from meshnet.deploy.config import LocalSwarmConfig


def stream_demo(base_url: str, model: str, config: LocalSwarmConfig, auth: dict[str, str], *, chat: bool) -> None:
    """Stream the demo answer: a chat turn, or a plain completion of the prompt for a base model."""
    print(f"\n> {config.prompt}\n")
    asked = {"messages": [{"role": "user", "content": config.prompt}]} if chat else {"prompt": config.prompt}
    body = {"model": model, **asked, "max_tokens": config.max_tokens, "temperature": 0, "stream": True}
    endpoint = f"{base_url}/v1/{'chat/completions' if chat else 'completions'}"
    telemetry: list[str] = []
    mid_line = False
    with httpx.stream("POST", endpoint, json=body, headers=auth, timeout=120) as response:
        if response.status_code != 200:  # said, never silent; the swarm still serves
            print(f"demo refused ({response.status_code}): {response.read().decode(errors='replace')}", file=sys.stderr)
            return
        for line in response.iter_lines():
            if line.startswith(": telemetry "):
                event = json.loads(line[len(": telemetry ") :])
                telemetry.append(describe_event(event))
                if event.get("kind") == "prefill_progress":
                    # One line rewritten in place per chunk: a long prompt is visibly moving.
                    print(f"\r  [{telemetry[-1]}]", end="", flush=True)
                    mid_line = True
                elif event.get("kind") != "progress":
                    print(f"{chr(10) if mid_line else ''}  [{telemetry[-1]}]")
                    mid_line = False
            elif line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content") or choice.get("text") or ""
                    print(text, end="", flush=True)
                    mid_line = mid_line or bool(text)
    print()


def describe_event(event: dict[str, object]) -> str:
    """One short line per telemetry event for the terminal; the full JSON is on the API."""
    kind = str(event.get("kind"))
    if kind == "accepted":
        hops = event.get("hops")
        route = " -> ".join(
            f"{h.get('address')}[{h.get('layers')}]"
            for h in (hops if isinstance(hops, list) else [])
            if isinstance(h, dict)
        )
        return f"accepted: {event.get('model')} {event.get('quantization')}, route {route}"
    if kind == "prefill_progress":
        eta = event.get("eta_seconds")
        what = "replay" if event.get("replay") else "prefill"
        eta_text = f", ETA {float(eta):.1f} s" if isinstance(eta, int | float) else ""
        return f"{what} {event.get('done_tokens')}/{event.get('total_tokens')} tokens{eta_text}"
    if kind == "prefill_completed":
        return f"prefill done: {event.get('prompt_tokens')} tokens in {float(event.get('seconds') or 0):.2f} s"  # type: ignore[arg-type]
    if kind == "completed":
        usage = event.get("usage") or {}
        return f"completed: {json.dumps(usage, separators=(',', ':'))}"
    details = {k: v for k, v in event.items() if k not in ("kind", "request_id", "seq", "at")}
    return f"{kind} {json.dumps(details, separators=(',', ':'))[:120]}"
