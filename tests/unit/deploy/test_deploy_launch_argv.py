"""The argv a launcher renders from a component's config is read back by the real ``meshnet``
parser, and the CLI's own config builders, as an equal config.

`meshnet up`, the lab, the bench and the test harnesses start every tracker, worker, gateway and
seeder with ``deploy.launch.commands``: if a flag were named, typed or defaulted differently on
the two sides, a launched component would silently run with another setting. Random valid
configs (hypothesis) go through ``worker_command`` & co., then through ``cli.main.build_parser``
and ``cli.commands.serve.worker_config`` & co., exactly as the child process does.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.cli import main as cli
from meshnet.cli.commands.serve import gateway_config, tracker_config, worker_config
from meshnet.cli.flags import config_from_arguments
from meshnet.core.config_flags import flag_spec, is_nested, render_arguments, unwrap_optional
from meshnet.core.devices import DEVICE_KINDS, DeviceRequest
from meshnet.core.durations import Seconds
from meshnet.core.errors import InvalidArgument
from meshnet.core.kv_type import KvType
from meshnet.core.layers import LayerRange
from meshnet.core.swarm_options import SecurityOptions
from meshnet.deploy.expert_launch import expert_node
from meshnet.deploy.launch.commands import INSECURE, gateway_command, seed_command, tracker_launch, worker_command
from meshnet.gateway.config import GatewayConfig, GatewayProcessConfig
from meshnet.moe.ownership import ExpertOwnership
from meshnet.node.artifact_server import SeedConfig
from meshnet.node.config import FakeModel, LayerChoice, WorkerConfig
from meshnet.process.launcher import meshnet_command
from meshnet.tracker.config import DEFAULT_DB_NAME, TrackerConfig

DATA_DIR = Path("/srv/meshnet-data")
PARSER = cli.build_parser()
EXAMPLES = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any printable text, a leading dash included (it must travel as --flag=-text); no control
# characters, which no argv carries.
# "--" is refused by render_arguments (argparse drops it from any value): test below.
TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x24F), min_size=1, max_size=12).filter(
    lambda t: t != "--"
)
ITEM = TEXT.filter(lambda text: "," not in text and text.strip() == text)  # one item of a comma list
NAME = st.text(st.sampled_from("abcxyz0129._/"), min_size=1, max_size=12)
PATH = NAME.map(Path)
POSITIVE = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
RANGE = st.integers(0, 40).flatmap(lambda start: st.integers(start + 1, 64).map(lambda stop: LayerRange(start, stop)))
ADDRESS = st.builds("{}:{}".format, st.sampled_from(["127.0.0.1", "10.1.2.3", "node.example"]), st.integers(1, 65535))
TRACKERS = st.lists(ADDRESS, min_size=1, max_size=3, unique=True).map(",".join)
"""``--tracker``: one address, or an ordered list of replicas."""
HOST = st.sampled_from(["127.0.0.1", "::1", "localhost", "0.0.0.0", "10.1.2.3"])
STORE = st.just("") | TRACKERS.map("etcd://{}".format)
"""``--store``: empty (the SQLite file), or etcd members."""


def _value(kind: Any) -> st.SearchStrategy[Any]:
    """Any value of a field's type, as the command line can express it."""
    inner, optional = unwrap_optional(kind)
    strategy: st.SearchStrategy[Any]
    if inner is bool:
        strategy = st.booleans()
    elif inner is int:
        strategy = st.integers(1, 65535)
    elif inner is float:
        strategy = POSITIVE
    elif inner is str:
        strategy = TEXT
    elif inner is Path:
        strategy = PATH
    elif typing.get_origin(inner) is Literal:
        strategy = st.sampled_from(typing.get_args(inner))
    elif typing.get_origin(inner) is tuple:
        strategy = st.lists(ITEM, max_size=3).map(tuple)
    elif inner is LayerChoice:
        strategy = st.one_of(st.just(LayerChoice(None)), RANGE.map(LayerChoice))
    elif inner is ExpertOwnership:
        strategy = st.integers(1, 8).flatmap(lambda n: st.integers(0, n - 1).map(lambda i: ExpertOwnership(i, n)))
    elif inner is KvType:
        strategy = st.sampled_from(list(KvType))
    elif inner is Seconds:
        strategy = st.integers(1, 10**7).map(Seconds)  # etcd's lease TTLs are whole seconds
    elif inner is DeviceRequest:
        gpu = st.builds(DeviceRequest, st.sampled_from(DEVICE_KINDS[1:]), st.none() | st.integers(0, 7))
        strategy = st.one_of(st.just(DeviceRequest("auto")), st.just(DeviceRequest("cpu")), gpu)
    elif is_nested(inner):
        strategy = _fields(inner).map(lambda values: inner(**values))
    else:
        raise AssertionError(f"no strategy for {kind!r}")
    return st.one_of(st.none(), strategy) if optional else strategy


def _fields(cls: type, **overrides: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Every field that has a flag, from its type (``overrides`` for fields with narrower rules)."""
    hints = typing.get_type_hints(cls)
    chosen = {
        field.name: overrides.get(field.name, _value(hints[field.name]))
        for field in dataclasses.fields(cls)
        if field.init and not flag_spec(field).hidden and field.name != "data_dir"
    }
    return st.fixed_dictionaries(chosen)


def _parse(command: tuple[str, ...]) -> Any:
    assert command[:3] == meshnet_command(DATA_DIR)[:3]  # python -m meshnet
    return PARSER.parse_args(list(command[3:]))


@st.composite
def workers(draw: st.DrawFn) -> WorkerConfig:
    values = draw(
        _fields(
            WorkerConfig,
            advertise=st.none() | ADDRESS,
            tracker=st.none() | TRACKERS,
            relay=st.lists(ADDRESS, max_size=3).map(tuple),
            port=st.integers(0, 65535),
            session_share=st.floats(min_value=1e-3, max_value=1.0),
            session_min_rate=POSITIVE,
            session_grace=POSITIVE,
        )
    )
    # The worker's own rules, met rather than filtered out: auto asks a tracker within a budget,
    # --model-id fetches through a tracker, a fake model needs no GGUF.
    # Relays carry a private worker that registers with a tracker.
    if values["relay"] and values["reachability"] == "public":
        values["reachability"] = draw(st.sampled_from(["auto", "private"]))
    if values["layer_choice"].fixed is None or values["model_id"] is not None or values["relay"]:
        values["tracker"] = values["tracker"] or draw(TRACKERS)
    if values["layer_choice"].fixed is None:
        values["memory_budget_mb"] = values["memory_budget_mb"] or draw(POSITIVE)
    if values["model"] is None and values["fake"] is None and values["model_id"] is None:
        values["fake"] = FakeModel()
    # An expert node and a group's front serve the whole model, which the CLI reads from the GGUF
    # (test below, with a real file): here every other field.
    values.update(experts=None, expert_cache_mb=None, expert_group=())
    # A quantized V cache is read only by flash attention.
    values["flash_attn"] = values["flash_attn"] or values["kv_type"].quantized
    # Snapshots are taken at whole prefill chunks.
    values["snapshot_every"] = values["prefill_chunk"] * draw(st.integers(0, 4))
    return WorkerConfig(**values, data_dir=DATA_DIR)


@given(workers(), _fields(SecurityOptions).map(lambda values: SecurityOptions(**values)))
@EXAMPLES
def test_a_rendered_worker_command_parses_back_to_its_config(config: WorkerConfig, security: SecurityOptions) -> None:
    args = _parse(worker_command(config, security))
    assert (args.command, args.data_dir) == ("worker", DATA_DIR)
    assert worker_config(args) == config
    assert config_from_arguments(SecurityOptions, args) == security


@given(_fields(TrackerConfig, port=st.integers(0, 65535), join_port=st.integers(0, 65535), store=STORE))
@EXAMPLES
def test_a_rendered_tracker_command_parses_back_to_its_config(values: dict[str, Any]) -> None:
    config = TrackerConfig(**values)
    args = _parse(tracker_launch(config, DATA_DIR).argv)
    # A database left at its default is the one the CLI places in the data dir, as --help says.
    expected = (
        config if config.db_path != Path(DEFAULT_DB_NAME) else replace(config, db_path=DATA_DIR / DEFAULT_DB_NAME)
    )
    assert tracker_config(args) == expected


@st.composite
def gateways(draw: st.DrawFn) -> GatewayProcessConfig:
    http = draw(_fields(GatewayConfig, host=HOST, port=st.integers(0, 65535), max_queue=st.none() | st.integers(0, 64)))
    http["default_max_tokens"] = min(http["default_max_tokens"], http["max_tokens_limit"])
    if http["max_in_flight"] is not None and http["max_queue"] is not None:
        http["telemetry_max_requests"] = max(
            http["telemetry_max_requests"], http["max_in_flight"] + http["max_queue"] + 1
        )
    if (http["tls_cert"] is None) != (http["tls_key"] is None):
        http["tls_key"] = None if http["tls_cert"] is None else draw(PATH)
    values = draw(_fields(GatewayProcessConfig, tracker=TRACKERS, audit_fraction=st.floats(0, 1), http=st.just(None)))
    values["http"] = GatewayConfig(**http)
    if values["allow_anonymous"] and http["host"] not in ("127.0.0.1", "::1", "localhost"):
        values["allow_anonymous"] = False
    # A local model file or a published model id, never both; a trusted publisher only with an id.
    if values["model_id"] is not None:
        values["model"] = None
    elif values["model"] is None:
        values["model"] = draw(PATH)
    if values["model_id"] is None:
        values["trust_publisher"] = None
    return GatewayProcessConfig(**values, data_dir=DATA_DIR)


@given(gateways(), _fields(SecurityOptions).map(lambda values: SecurityOptions(**values)))
@EXAMPLES
def test_a_rendered_gateway_command_parses_back_to_its_config(
    config: GatewayProcessConfig, security: SecurityOptions
) -> None:
    args = _parse(gateway_command(config, security))
    assert gateway_config(args) == config
    assert config_from_arguments(SecurityOptions, args) == security


@given(_fields(SeedConfig, advertise=st.none() | ADDRESS, port=st.integers(0, 65535), tracker=st.none() | TRACKERS))
@EXAMPLES
def test_a_rendered_seed_command_parses_back_to_its_config(values: dict[str, Any]) -> None:
    config = SeedConfig(**values)
    args = _parse(seed_command(config, DATA_DIR, INSECURE))
    assert config_from_arguments(SeedConfig, args) == config


def test_an_expert_node_and_a_front_parse_back_with_the_whole_model(synthetic_model_factory: Any) -> None:
    """Their layers are implied (the CLI reads them from the model, and refuses --layers beside
    --experts), so this needs a real MoE GGUF."""
    model = synthetic_model_factory(SyntheticSpec(architecture="qwen3moe", n_layers=2, n_expert=8, n_expert_used=2))
    node = replace(
        expert_node(DATA_DIR, model, 3),
        experts=ExpertOwnership(2, 3),
        expert_peers=("a@127.0.0.1:1", "b@127.0.0.1:2", "c@127.0.0.1:3"),
        expert_cache_mb=1.5,
        threads=1,
        n_ctx_per_session=512,
    )
    command = worker_command(node, INSECURE)
    assert "--layers" not in command and "--experts" in command
    assert worker_config(_parse(command)) == node
    front = WorkerConfig(
        model=model, layer_choice=LayerChoice(LayerRange(0, 2)), data_dir=DATA_DIR, expert_group=("h:1", "h:2")
    )
    assert worker_config(_parse(worker_command(front, INSECURE))) == front


def test_a_default_config_renders_no_flag_and_a_non_default_one_only_its_own() -> None:
    assert render_arguments(TrackerConfig()) == []
    assert render_arguments(TrackerConfig(port=0, heartbeat_interval_s=0.5, insecure=True)) == [
        "--port",
        "0",
        "--heartbeat-interval",
        "0.5",
        "--insecure",
    ]
    fake = WorkerConfig(model=None, layer_choice=LayerChoice(LayerRange(0, 2)), data_dir=DATA_DIR, fake=FakeModel())
    # A set optional group whose fields are all defaults still names one, so the parser builds it.
    assert render_arguments(fake, skip=("data_dir",)) == ["--layers", "0:2", "--fake-layers", "6"]


def test_a_value_that_would_not_read_back_is_refused() -> None:
    config = WorkerConfig(model=Path("m.gguf"), layer_choice=LayerChoice(LayerRange(0, 2)), data_dir=DATA_DIR)
    with pytest.raises(InvalidArgument, match="comma-separated"):
        render_arguments(replace(config, expert_peers=("a,b",)), skip=("data_dir",))
    with pytest.raises(InvalidArgument, match="does not read back"):
        render_arguments(replace(config, evict_idle_after=float("nan")), skip=("data_dir",))
    assert render_arguments(replace(config, model_name="-dash"), skip=("data_dir",))[-1] == "--model-name=-dash"


def test_a_value_argparse_would_drop_is_refused_not_lost() -> None:
    config = WorkerConfig(model=None, layer_choice=LayerChoice(LayerRange(0, 2)), data_dir=DATA_DIR, fake=FakeModel())
    with pytest.raises(InvalidArgument, match="'--'"):
        render_arguments(replace(config, trust_publisher="--"), skip=("data_dir",))
