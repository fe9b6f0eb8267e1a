"""Route planning as pure functions: speed, compatibility, KV room, capability, explanations."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracker_samples import (
    FINGERPRINT,
    MODEL,
    N_LAYERS,
    OTHER_FINGERPRINT,
    OTHER_RECIPE,
    RECIPE,
    SMALL_OTHER_RECIPE,
    SMALL_RECIPE,
    view,
)

from meshnet.core.devices import DeviceDrift, route_numerics
from meshnet.core.errors import NoRoute
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.tracker.route_costs import NodeView, RoutingCosts, node_cost_ms
from meshnet.tracker.routing import choose_model_route, choose_route, uncovered_layers


def ids(plan_hops: tuple[RouteHop, ...]) -> list[str]:
    return [hop.node_id for hop in plan_hops]


def test_picks_the_faster_of_two_compatible_paths() -> None:
    # Two fast halves (10 + 10 ms + one seam) beat one slow whole (25 ms)...
    nodes = [view("a", 0, 10, rate=100), view("b", 10, 20, rate=100), view("w", 0, 20, rate=40)]
    plan = choose_route(nodes, N_LAYERS, FINGERPRINT)
    assert ids(plan.hops) == ["a", "b"]
    assert plan.ms_per_token == pytest.approx(10 + 10 + 1.0 + 0.5)
    # ...and lose when the whole is faster than the halves plus their seam.
    nodes[2] = view("w", 0, 20, rate=50)
    assert ids(choose_route(nodes, N_LAYERS, FINGERPRINT).hops) == ["w"]


def test_measured_seam_latency_changes_the_choice() -> None:
    nodes = [view("a", 0, 10, rate=100), view("b", 10, 20, rate=100), view("w", 0, 20, rate=40)]
    slow_seam = {(NodeId("a"), NodeId("b")): 30.0}
    assert ids(choose_route(nodes, N_LAYERS, FINGERPRINT, latency_ms=slow_seam).hops) == ["w"]


def test_never_mixes_fingerprints() -> None:
    nodes = [view("a", 0, 10), view("b", 10, 20, recipe=OTHER_RECIPE)]
    with pytest.raises(NoRoute, match="10:20"):
        choose_route(nodes, N_LAYERS, FINGERPRINT)
    with pytest.raises(NoRoute):
        choose_model_route(nodes, MODEL)


def test_model_name_picks_the_fastest_complete_recipe_without_mixing() -> None:
    # OTHER is faster per node but only covers half; it must not lend its half to FINGERPRINT.
    nodes = [
        view("a", 0, 10, rate=50),
        view("b", 10, 20, rate=50),
        view("x", 0, 10, rate=500, recipe=OTHER_RECIPE),
    ]
    plan = choose_model_route(nodes, MODEL)
    assert plan.fingerprint == FINGERPRINT and ids(plan.hops) == ["a", "b"]
    nodes.append(view("y", 10, 20, rate=500, recipe=OTHER_RECIPE))
    plan = choose_model_route(nodes, MODEL)
    assert plan.fingerprint == OTHER_FINGERPRINT and ids(plan.hops) == ["x", "y"]
    assert choose_model_route(nodes, FINGERPRINT).fingerprint == FINGERPRINT


def test_avoids_shards_without_kv_room() -> None:
    nodes = [view("fast", 0, 20, rate=200, free_sessions=0), view("slow", 0, 20, rate=20)]
    assert ids(choose_route(nodes, N_LAYERS, FINGERPRINT).hops) == ["slow"]


def test_a_full_shard_is_still_chosen_when_it_is_the_only_cover() -> None:
    # Penalized, not excluded: the node's own fast RESOURCE_EXHAUSTED is the truthful answer.
    nodes = [view("a", 0, 10), view("full", 10, 20, free_sessions=0)]
    plan = choose_route(nodes, N_LAYERS, FINGERPRINT)
    assert ids(plan.hops) == ["a", "full"]
    assert plan.ms_per_token >= RoutingCosts().full_node_penalty_ms


def test_queue_depth_is_penalized() -> None:
    nodes = [view("busy", 0, 20, rate=100, queue_depth=3), view("idle", 0, 20, rate=40)]
    assert ids(choose_route(nodes, N_LAYERS, FINGERPRINT).hops) == ["idle"]


def test_unmeasured_nodes_are_charged_pessimistically() -> None:
    unmeasured = view("u", 0, 20, rate=0)
    assert node_cost_ms(unmeasured) == pytest.approx(20 * RoutingCosts().unmeasured_layer_ms)
    nodes = [unmeasured, view("m", 0, 20, rate=20)]
    assert ids(choose_route(nodes, N_LAYERS, FINGERPRINT).hops) == ["m"]


def test_names_uncovered_layers() -> None:
    nodes = [view("a", 0, 10), view("b", 15, 18)]
    with pytest.raises(NoRoute) as caught:
        choose_route(nodes, N_LAYERS, FINGERPRINT)
    assert "layers 10:15, 18:20 have no live shard" in caught.value.message
    assert uncovered_layers(nodes, N_LAYERS) == (LayerRange(10, 15), LayerRange(18, 20))


def test_ranges_that_overlap_without_meeting_are_explained() -> None:
    nodes = [view("a", 0, 10), view("b", 5, 20)]
    with pytest.raises(NoRoute, match="no shard starts at layer 10"):
        choose_route(nodes, N_LAYERS, FINGERPRINT)


def test_excluded_nodes_are_not_used() -> None:
    nodes = [view("a", 0, 20, rate=100), view("b", 0, 20, rate=10)]
    plan = choose_route(nodes, N_LAYERS, FINGERPRINT, exclude={NodeId("a")})
    assert ids(plan.hops) == ["b"]
    with pytest.raises(NoRoute, match="2 excluded"):
        choose_route(nodes, N_LAYERS, FINGERPRINT, exclude={NodeId("a"), NodeId("b")})


def test_every_hop_carries_its_nodes_capability() -> None:
    # The route client sizes frames and checks the context from the hops: no call to the nodes.
    nodes = [view("a", 0, 10), view("b", 10, 20)]
    plan = choose_route(nodes, N_LAYERS, FINGERPRINT)
    by_id = {node.node_id: node for node in nodes}
    for hop in plan.hops:
        record = by_id[hop.node_id].record
        assert (hop.address, hop.layers, hop.capability) == (record.address, record.layers, record.capability)


def test_ties_break_on_fewer_hops_then_node_id() -> None:
    # Exactly equal cost with free seams: 10 + 10 ms in two hops, 20 ms in one.
    free_seams = RoutingCosts(default_latency_ms=0.0, seam_overhead_ms=0.0)
    nodes = [view("h", 0, 10, rate=100), view("t", 10, 20, rate=100), view("z", 0, 20, rate=50)]
    plan = choose_route(nodes, N_LAYERS, FINGERPRINT, costs=free_seams)
    assert plan.ms_per_token == 20.0 and ids(plan.hops) == ["z"]
    twins = [view("b", 0, 20), view("a", 0, 20)]
    assert ids(choose_route(twins, N_LAYERS, FINGERPRINT).hops) == ["a"]


def test_unknown_model_is_named() -> None:
    with pytest.raises(NoRoute, match="no live shard serves model 'nope'"):
        choose_model_route([view("a", 0, 20)], "nope")


@st.composite
def swarms(draw: st.DrawFn) -> list[NodeView]:
    n = draw(st.integers(min_value=0, max_value=8))
    nodes = []
    for index in range(n):
        start = draw(st.integers(min_value=0, max_value=7))
        stop = draw(st.integers(min_value=start + 1, max_value=8))
        nodes.append(
            view(
                f"n{index}",
                start,
                stop,
                rate=draw(st.sampled_from([0.0, 10.0, 100.0])),
                recipe=draw(st.sampled_from([SMALL_RECIPE, SMALL_OTHER_RECIPE])),
                free_sessions=draw(st.integers(min_value=0, max_value=2)),
            )
        )
    return nodes


def _chain_exists(nodes: list[NodeView]) -> bool:
    usable = [n for n in nodes if n.fingerprint == SMALL_RECIPE.fingerprint()]
    reachable, changed = {0}, True
    while changed:
        changed = False
        for node in usable:
            if node.layers.start in reachable and node.layers.stop not in reachable:
                reachable.add(node.layers.stop)
                changed = True
    return 8 in reachable


@settings(max_examples=300, deadline=None)
@given(swarms())
def test_any_route_is_a_contiguous_single_recipe_cover(nodes: list[NodeView]) -> None:
    by_id = {node.node_id: node for node in nodes}
    try:
        plan = choose_route(nodes, 8, SMALL_RECIPE.fingerprint())
    except NoRoute:
        assert not _chain_exists(nodes)
        return
    assert _chain_exists(nodes)
    assert plan.hops[0].layers.start == 0 and plan.hops[-1].layers.stop == 8
    for before, after in zip(plan.hops, plan.hops[1:], strict=False):
        assert before.layers.stop == after.layers.start
    for hop in plan.hops:
        assert by_id[hop.node_id].fingerprint == SMALL_RECIPE.fingerprint()


def test_an_unknown_model_names_what_the_live_shards_serve() -> None:
    [served] = {node.model for node in [view("a", 0, 20)]}
    with pytest.raises(NoRoute, match=f"live shards serve '{served}'; check --model-name"):
        choose_model_route([view("a", 0, 20)], "nope")


def test_a_route_needing_two_device_classes_is_refused_naming_both() -> None:
    """A CUDA head and a CPU tail of one model cover every layer, but their kernels compute
    different numbers: no route, and the reason names both device classes and their layers."""
    cuda = replace(RECIPE, device_class="cuda:NVIDIA H200 gpu_layers=all")
    nodes = [view("head", 0, 10, recipe=cuda), view("tail", 10, 20)]
    with pytest.raises(NoRoute) as refused:
        choose_model_route(nodes, MODEL)
    message = refused.value.message
    assert "two device classes" in message
    assert f"cuda:NVIDIA H200 gpu_layers=all (recipe {cuda.fingerprint()}, layers 0:10)" in message
    assert f"cpu (recipe {RECIPE.fingerprint()}, layers 10:20)" in message
    # Each class on its own covers nothing: the old explanation would only have said "missing".
    nodes.append(view("gpu-tail", 10, 20, recipe=cuda))
    assert ids(choose_model_route(nodes, MODEL).hops) == ["head", "gpu-tail"]


def test_layers_really_missing_are_not_blamed_on_devices() -> None:
    cuda = replace(RECIPE, device_class="cuda:NVIDIA H200 gpu_layers=all")
    with pytest.raises(NoRoute, match="15:20") as refused:
        choose_model_route([view("head", 0, 10, recipe=cuda), view("tail", 10, 15)], MODEL)
    assert "device classes" not in refused.value.message


def _on_gpu(node: NodeView, drift: DeviceDrift | None) -> NodeView:
    capability = replace(node.record.capability, device="cuda", device_name="NVIDIA H200", drift=drift)
    return replace(node, record=replace(node.record, capability=capability))


def test_with_the_opt_in_a_mixed_route_is_planned_over_measured_nodes_only() -> None:
    cuda = replace(RECIPE, device_class="cuda:NVIDIA H200 gpu_layers=all")
    drift = DeviceDrift(top1_agreement=0.95, max_abs_logit_diff=0.25, positions=16)
    head = _on_gpu(view("head", 0, 10, recipe=cuda), drift)
    nodes = [head, view("tail", 10, 20)]
    plan = choose_model_route(nodes, MODEL, mixed_devices=True)
    assert ids(plan.hops) == ["head", "tail"]
    assert plan.fingerprint == RECIPE.family_fingerprint() == cuda.family_fingerprint()
    assert plan.fingerprint not in (RECIPE.fingerprint(), cuda.fingerprint())
    assert route_numerics(plan.fingerprint, tuple(h.capability.drift for h in plan.hops)).startswith(
        "mixed (top-1 agreement 0.950, max |logit diff| 0.25"
    )
    # A GPU node that never measured its drift takes no part in a mixed route.
    with pytest.raises(NoRoute):
        choose_model_route([_on_gpu(view("head", 0, 10, recipe=cuda), None), nodes[1]], MODEL, mixed_devices=True)
    # An exact route still wins whenever one exists.
    exact = [*nodes, view("cpu-head", 0, 10)]
    plan = choose_model_route(exact, MODEL, mixed_devices=True)
    assert plan.fingerprint == RECIPE.fingerprint() and ids(plan.hops) == ["cpu-head", "tail"]
    assert route_numerics(plan.fingerprint, tuple(h.capability.drift for h in plan.hops)) == "exact"
