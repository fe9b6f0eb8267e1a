"""`meshnet up` on a base model (no chat template), run as a real process on a synthetic model.

- `up` says at start that the model has no chat template and how to give one, streams its demo
  as a plain completion (it used to print nothing), and its gateway answers chat with a typed 400
  that names `--chat-template` and the completions endpoint, while completions are served.
- `up --chat-template FILE` hands the template to its gateway: chat is served.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from swarm_harness import TINY_SPEC
from up_harness import chat, running_up

from meshnet.artifact.synthetic import write_synthetic_model

pytestmark = pytest.mark.timeout(180)

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def base_model(folder: Path) -> Path:
    return write_synthetic_model(folder / "base.gguf", replace(TINY_SPEC, chat_template=None))


def test_up_on_a_base_model_says_so_demos_a_completion_and_refuses_chat_with_the_fix(tmp_path: Path) -> None:
    with running_up(tmp_path, base_model(tmp_path)) as (base, auth):
        refused = chat(base, auth)
        model = httpx.get(f"{base}/models", headers=auth, timeout=10).json()["data"][0]["id"]
        body = {"model": model, "prompt": "the sea", "max_tokens": 4, "temperature": 0}
        completed = httpx.post(f"{base}/completions", json=body, headers=auth, timeout=30)
    log = (tmp_path / "up.log").read_text()
    assert "base.gguf has no chat template (a base model)" in log and "--chat-template FILE" in log, log
    demo = log.split("> hi", 1)[1]
    assert "completed:" in demo and "demo refused" not in demo, log
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "chat_template_missing"
    assert "--chat-template" in error["message"] and "/v1/completions" in error["message"]
    assert completed.status_code == 200, completed.text


def test_up_chat_template_serves_chat_on_a_base_model(tmp_path: Path) -> None:
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    with running_up(tmp_path, base_model(tmp_path), "--chat-template", str(template)) as (base, auth):
        answered = chat(base, auth)
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["role"] == "assistant"
    log = (tmp_path / "up.log").read_text()
    assert "no chat template" not in log and "completed:" in log.split("> hi", 1)[1], log
