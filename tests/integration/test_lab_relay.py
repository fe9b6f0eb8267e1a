"""Issue 33's acceptance in the lab: ``lab up --private 1 --relays 2`` on the tiny model.

The middle node sits behind a NAT router of its own (real namespaces, iptables MASQUERADE, no
inbound path); two relay nodes run ``meshnet relay``; the private worker attaches to the first
and registers ``NODE@RELAY``. Everything is real: processes, mTLS handshakes end to end through
the relay, the NAT. Checked: a direct dial to the middle node fails; the relayed route's greedy
output equals whole-model llama.cpp, through the official ``openai`` client, streamed; the relay's
captured bytes are TLS records only and a packet capture in the relay's namespace holds no
plaintext; the relay killed mid-stream, the node re-attaches to the second relay and the request
fails over with identical output; with no relay left, the stream ends with a typed error
within 5 s; and the lab leaves nothing behind (routers included).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI
from swarm_harness import MODEL_NAME, PROMPT, Reference, SseItem, chat_body, read_sse

from meshnet.core.addresses import parse_relayed
from meshnet.core.layers import LayerRange
from meshnet.deploy.lab import cgroups
from meshnet.deploy.lab.lab import WORKER_PORT, Lab, LabConfig
from meshnet.deploy.lab.plan import PREFIX
from meshnet.deploy.lab.swarm import LabSwarm, client_auth, registered_address, start_swarm
from meshnet.deploy.lab.system import LabUnavailable, check_privileges, run

TAG = "t33r"
MAX_TOKENS = 200
KILL_AFTER = 30
ERROR_WITHIN_S = 5.0
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TLS_CONTENT_TYPES = {20, 21, 22, 23}
"""change_cipher_spec, alert, handshake, application_data: every record type TLS has."""
TLS_MAX_RECORD = 2**14 + 256


def _lab_allowed() -> str | None:
    try:
        check_privileges(private=True)
        cgroups.detect_layout()
    except LabUnavailable as error:
        return error.message
    return None


pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(_lab_allowed() is not None, reason=f"no NAT lab here: {_lab_allowed()}"),
]


def _lab_objects() -> list[str]:
    namespaces = [line.split()[0] for line in run(["ip", "netns", "list"]).stdout.splitlines() if line.strip()]
    found = [name for name in namespaces if name.startswith(f"{PREFIX}-{TAG}-")]
    found += [word for word in run(["ip", "-o", "link"]).stdout.split() if word.startswith(f"{PREFIX}{TAG}")]
    return found + [str(top) for top in cgroups.group_tops() if top.name == f"{PREFIX}-{TAG}"]


@pytest.fixture(scope="module")
def expected(model: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    reference = Reference(model, tmp_path_factory.mktemp("ref"))
    try:
        return reference.text(reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS))
    finally:
        reference.close()


@pytest.fixture(scope="module")
def lab(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, LabSwarm]]:
    data = tmp_path_factory.mktemp("lab")
    config = LabConfig(
        model=model,
        data_dir=data,
        nodes=3,
        private=1,
        relays=2,
        delay_ms=2,
        bandwidth_mbit=100,
        context=512,
        sessions=2,
        model_name=MODEL_NAME,
        tag=TAG,
        ranges=(LayerRange(0, 2), LayerRange(2, 4), LayerRange(4, 6)),
        capture_dir=data / "captures",
    )
    the_lab = Lab(config)
    try:
        the_lab.build()
        yield the_lab, start_swarm(the_lab)
    finally:
        the_lab.close()
    assert _lab_objects() == []  # routers, their rules, nodes, links, cgroups: all gone


def _middle_address(the_lab: Lab, swarm: LabSwarm) -> str | None:
    return registered_address(the_lab, swarm.tracker, swarm.node_ids[1])


DIAL = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("connected")
except OSError as error:
    print("refused", error)
"""


def _dial(namespace: str, host: str, port: int) -> str:
    command = ["ip", "netns", "exec", namespace, sys.executable, "-c", DIAL, host, str(port)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()


def test_the_middle_node_is_reached_only_through_the_relay(lab: tuple[Lab, LabSwarm]) -> None:
    the_lab, swarm = lab
    plan = the_lab.plan
    assert plan is not None
    middle = plan.nodes[1]
    assert middle.router is not None
    relayed = parse_relayed(swarm.advertised[1])
    assert relayed is not None and relayed.node_id == swarm.node_ids[1]
    assert relayed.relay == swarm.relays[plan.relays()[0].index]  # attached to the first relay of its list
    assert _middle_address(the_lab, swarm) == swarm.advertised[1]
    for source in (plan.nodes[0], plan.nodes[2]):
        assert _dial(source.namespace, middle.address, WORKER_PORT).startswith("refused")
        assert _dial(source.namespace, middle.router.public_address, WORKER_PORT).startswith("refused")
    # The public nodes are dialled directly, as before.
    assert _dial(plan.nodes[0].namespace, plan.nodes[2].address, WORKER_PORT) == "connected"


def test_the_relayed_route_streams_the_whole_model_output_to_the_openai_client(
    lab: tuple[Lab, LabSwarm], expected: str
) -> None:
    _, swarm = lab
    accepted = read_sse(swarm.gateway_url, "/v1/chat/completions", chat_body(8), headers=client_auth(swarm))
    hops = next(event for event in accepted.telemetry("accepted"))["hops"]
    assert hops[1]["address"] == swarm.advertised[1], "the route must cross the relay into the middle node"
    client = OpenAI(base_url=f"{swarm.gateway_url}/v1", api_key=client_auth(swarm)["Authorization"][7:], timeout=60)
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len([piece for piece in pieces if piece]) > 1, "the answer must arrive streamed, in pieces"
    assert "".join(pieces) == expected


def _tls_records(data: bytes) -> list[int]:
    """The content types of the TLS records ``data`` is made of; AssertionError at the first byte
    that is not a record header. A capture cut while a record was written may end inside it."""
    types, offset = [], 0
    while offset + 5 <= len(data):
        kind, major, minor, length = (
            data[offset],
            data[offset + 1],
            data[offset + 2],
            (int.from_bytes(data[offset + 3 : offset + 5], "big")),
        )
        assert kind in TLS_CONTENT_TYPES and major == 3 and minor in (1, 2, 3) and 0 < length <= TLS_MAX_RECORD, (
            f"not a TLS record at byte {offset}: {data[offset : offset + 16].hex()}"
        )
        types.append(kind)
        offset += 5 + length
    return types


PACKETS = """
import signal, socket, sys
out = open(sys.argv[1], "wb")
capture = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
capture.settimeout(0.2)
signal.signal(signal.SIGTERM, lambda *_: (out.close(), sys.exit(0)))
print("capturing", flush=True)
while True:
    try:
        out.write(capture.recv(65535))
    except TimeoutError:
        out.flush()
"""


def test_the_relay_sees_tls_records_only(lab: tuple[Lab, LabSwarm], expected: str, tmp_path: Path) -> None:
    the_lab, swarm = lab
    plan = the_lab.plan
    assert plan is not None and the_lab.config.capture_dir is not None
    relay_node = plan.relays()[0]
    packets = tmp_path / "packets.bin"
    command = ["ip", "netns", "exec", relay_node.namespace, sys.executable, "-c", PACKETS, str(packets)]
    sniffer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert sniffer.stdout is not None and sniffer.stdout.readline().strip() == "capturing"
        answer = read_sse(swarm.gateway_url, "/v1/chat/completions", chat_body(MAX_TOKENS), headers=client_auth(swarm))
        assert answer.text == expected
    finally:
        sniffer.send_signal(signal.SIGTERM)
        sniffer.wait(timeout=10)
    with pytest.raises(AssertionError, match="not a TLS record"):  # the check can fail: plaintext h2 does
        _tls_records(HTTP2_PREFACE + bytes(64))
    wire = packets.read_bytes()
    assert len(wire) > 20_000, "the packet capture saw almost nothing cross the relay's link"
    captures = sorted((the_lab.config.capture_dir / f"relay-n{relay_node.index}").glob("*.bin"))
    assert captures, "the relay captured no spliced connection"
    spliced = 0
    for path in captures:
        data = path.read_bytes()
        types = _tls_records(data)
        spliced += len(data)
        if path.name.endswith("-to-node.bin") and types:
            assert types[0] == 22, f"{path.name} does not open with a TLS handshake record"
        assert 23 in types or len(data) < 4096, f"{path.name}: no application data records"
    assert spliced > 10_000
    print(f"\nrelay capture: {len(captures)} file(s), {spliced} spliced bytes, all TLS; {len(wire)} on the wire")
    for blob in [wire, *(path.read_bytes() for path in captures)]:
        assert HTTP2_PREFACE not in blob, "plaintext HTTP/2 (the shard protocol) crossed the relay"
        assert PROMPT.encode() not in blob and expected[:24].encode() not in blob


class RelayKiller:
    """Reads the stream; after ``after`` text chunks, SIGKILLs the relay the middle node is attached to."""

    def __init__(self, the_lab: Lab, relay_index: int, after: int) -> None:
        self.relay = next(c for c in the_lab.components if c.name == f"relay-n{relay_index}")
        self.after = after
        self.killed_at: float | None = None
        self._chunks = 0

    def __call__(self, item: SseItem, items: list[SseItem]) -> None:
        if item.kind == "chunk" and item.text:
            self._chunks += 1
            if self._chunks == self.after and self.killed_at is None:
                self.relay.send_signal(signal.SIGKILL)
                self.killed_at = time.monotonic()


def test_a_relay_killed_mid_stream_fails_over_to_the_second_relay(lab: tuple[Lab, LabSwarm], expected: str) -> None:
    the_lab, swarm = lab
    plan = the_lab.plan
    assert plan is not None
    first, second = plan.relays()
    killer = RelayKiller(the_lab, first.index, KILL_AFTER)
    result = read_sse(
        swarm.gateway_url, "/v1/chat/completions", chat_body(MAX_TOKENS), on_item=killer, headers=client_auth(swarm)
    )
    assert killer.killed_at is not None, "the stream ended before the relay was killed"
    assert not [item for item in result.items if item.kind == "error"], result.items[-3:]
    assert [event["status"] for event in result.telemetry("route_health")] == ["failover"]
    assert result.text == expected
    moved = parse_relayed(_middle_address(the_lab, swarm) or "")
    assert moved is not None and moved.relay == swarm.relays[second.index]
    replacement = result.telemetry("accepted")[-1]["hops"]
    assert replacement[1]["address"] == f"{swarm.node_ids[1]}@{swarm.relays[second.index]}"
    health = [item for item in result.items if item.kind == "telemetry" and item.payload["kind"] == "route_health"]
    failover = health[0]
    resumed = next(item for item in result.items[result.items.index(failover) :] if item.text)
    print(
        f"\nrelay killed: route_health {(failover.at - killer.killed_at) * 1000:.0f} ms, "
        f"first token through the second relay {(resumed.at - killer.killed_at) * 1000:.0f} ms after the kill"
    )


def test_with_no_relay_left_the_stream_ends_with_a_typed_error_within_5_s(lab: tuple[Lab, LabSwarm]) -> None:
    the_lab, swarm = lab
    plan = the_lab.plan
    assert plan is not None
    killer = RelayKiller(the_lab, plan.relays()[1].index, KILL_AFTER)
    result = read_sse(
        swarm.gateway_url, "/v1/chat/completions", chat_body(MAX_TOKENS), on_item=killer, headers=client_auth(swarm)
    )
    assert killer.killed_at is not None, "the stream ended before the relay was killed"
    kinds = [item.kind for item in result.items]
    assert kinds[-2:] == ["error", "done"], kinds[-5:]
    error = result.items[-2].payload["error"]
    assert error["code"] in ("worker_lost", "no_route"), error
    waited = result.items[-1].at - killer.killed_at
    print(f"\nno relay left: {error['code']!r} and [DONE] {waited * 1000:.0f} ms after the kill")
    assert waited <= ERROR_WITHIN_S
