"""SmolLM2-135M-Instruct through `meshnet up --context 8192`: /v1/models says 8,192 and a
6,000-token prompt (three times the context `up` used to serve) through its 3 workers answers
exactly what the whole model answers in process.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and the provisioned model.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from smollm2_model import ENABLED_MARK, MODEL, PROVISIONED_MARK
from swarm_harness import Reference, meshnet_command

from meshnet.deploy.launch.ready_lines import UpLine
from meshnet.process.launcher import ChildProcess, LaunchSpec

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(400),
    ENABLED_MARK,
    PROVISIONED_MARK,
]

CONTEXT, PROMPT_TOKENS, ANSWER_TOKENS = 8192, 6000, 16
TEXT = (
    "The committee met on a grey morning to review the harbour accounts. Each ledger listed the ships, "
    "their cargo, the fees paid at the quay and the names of the clerks who checked them. "
)


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_6000_token_prompt_through_up_context_8192_equals_the_whole_model(tmp_path: Path) -> None:
    reference = Reference(MODEL, tmp_path / "reference-cache", context=CONTEXT)
    try:
        text = TEXT * (PROMPT_TOKENS // 20)
        prompt = list(reference.text_tokens(text)[:PROMPT_TOKENS])
        assert len(prompt) == PROMPT_TOKENS
        expected = reference.text(reference.generate(prompt, ANSWER_TOKENS))
    finally:
        reference.close()
    port = _free_port()
    command = meshnet_command(
        tmp_path, "up", "--model", str(MODEL), "--context", str(CONTEXT), "--port", str(port),
        "--max-tokens", "2", "--prompt", "hi",
    )  # fmt: skip
    child = ChildProcess(LaunchSpec("up", tuple(command), tmp_path / "up.log", UpLine.PREFIX))
    try:
        child.await_ready(time.monotonic() + 180)
        auth = {"Authorization": f"Bearer {(tmp_path / 'api-key').read_text().strip()}"}
        base = f"http://127.0.0.1:{port}/v1"
        card = httpx.get(f"{base}/models", headers=auth, timeout=10).json()["data"][0]
        assert card["context_length"] == CONTEXT
        body = {"model": card["id"], "prompt": prompt, "max_tokens": ANSWER_TOKENS, "temperature": 0}
        answer = httpx.post(f"{base}/completions", json=body, headers=auth, timeout=300)
    finally:
        child.stop()
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == PROMPT_TOKENS
    assert answer.json()["choices"][0]["text"] == expected
