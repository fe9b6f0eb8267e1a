"""Reading a child's ready line: the address, key=value fields, and a last field with spaces.

The generic reader only; each component's own line is defined in ``deploy.launch.ready_lines``."""

from meshnet.process.launcher import ReadyLine

PREFIX = "component ready "


def test_a_last_field_may_hold_spaces() -> None:
    line = ReadyLine(PREFIX + "http://127.0.0.1:8080 model=Smollm2 135M 8k Lc100K Mix1 Ep2", PREFIX)
    assert line.first == "http://127.0.0.1:8080"
    assert line.value_to_end("model") == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert line.value_to_end("absent") == ""


def test_fields_are_read_by_key() -> None:
    line = ReadyLine(PREFIX + "127.0.0.1:4000 node=n-1 recipe=rcp-2 metrics=http://127.0.0.1:9/metrics", PREFIX)
    assert line.first == "127.0.0.1:4000"
    assert line.values == {"node": "n-1", "recipe": "rcp-2", "metrics": "http://127.0.0.1:9/metrics"}
