"""`meshnet up` on the real Gemma 3 270M, a base model with no chat template, as a real process
with two real workers: it says so at start, its demo is a plain completion (it printed nothing),
chat is a typed 400 naming the fix, and `up --chat-template FILE` serves chat."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from gemma3_model import MARKS, MODEL
from up_harness import chat, running_up

pytestmark = [*MARKS, pytest.mark.timeout(300)]

TEMPLATE = "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
TEMPLATE += "<start_of_turn>model\n"


def test_up_on_gemma3_says_it_has_no_chat_template_and_demos_a_completion(tmp_path: Path) -> None:
    with running_up(tmp_path, MODEL) as (base, auth):
        refused = chat(base, auth)
    log = (tmp_path / "up.log").read_text()
    assert f"{MODEL.name} has no chat template (a base model)" in log, log
    assert "completed:" in log.split("> hi", 1)[1], log
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "chat_template_missing", refused.text
    assert "--chat-template" in refused.json()["error"]["message"]


def test_up_chat_template_serves_chat_on_gemma3(tmp_path: Path) -> None:
    template = tmp_path / "gemma.jinja"
    template.write_text(TEMPLATE)
    with running_up(tmp_path, MODEL, "--chat-template", str(template)) as (base, auth):
        answered = chat(base, auth)
    assert answered.status_code == 200, answered.text
    assert answered.json()["usage"]["completion_tokens"] >= 1
