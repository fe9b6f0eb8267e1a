"""Reading a child's ready line: the address, key=value fields, and a last field with spaces."""

from meshnet.process.launcher import ReadyLine

GATEWAY = "meshnet gateway ready "


def test_a_gateway_ready_line_keeps_a_model_name_with_spaces() -> None:
    line = ReadyLine(GATEWAY + "http://127.0.0.1:8080 model=Smollm2 135M 8k Lc100K Mix1 Ep2", GATEWAY)
    assert line.first == "http://127.0.0.1:8080"
    assert line.value_to_end("model") == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert line.value_to_end("absent") == ""


def test_worker_fields_are_read_by_key() -> None:
    prefix = "meshnet worker ready "
    line = ReadyLine(prefix + "127.0.0.1:4000 node=n-1 recipe=rcp-2 metrics=http://127.0.0.1:9/metrics", prefix)
    assert line.first == "127.0.0.1:4000"
    assert line.values == {"node": "n-1", "recipe": "rcp-2", "metrics": "http://127.0.0.1:9/metrics"}
