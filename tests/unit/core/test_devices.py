"""``--device`` parsing and the choice among the devices a build offers: pure decisions."""

from __future__ import annotations

import pytest

from meshnet.core.devices import (
    AUTO,
    CPU,
    DEVICE_HEADROOM,
    DeviceDrift,
    DeviceInfo,
    DeviceRequest,
    choose_device,
    placement_budget,
    route_drift,
    route_numerics,
)
from meshnet.core.errors import FailedPrecondition, InvalidArgument

VULKAN0 = DeviceInfo("vulkan", 0, "Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 2**33, 2**32)
CUDA0 = DeviceInfo("cuda", 0, "CUDA0", "NVIDIA H200", 141 * 2**30, 140 * 2**30)
CUDA1 = DeviceInfo("cuda", 1, "CUDA1", "NVIDIA RTX 4090", 24 * 2**30, 23 * 2**30)


@pytest.mark.parametrize(
    ("text", "request_"),
    [
        ("auto", AUTO),
        ("cpu", DeviceRequest("cpu")),
        ("CUDA", DeviceRequest("cuda")),
        ("cuda:1", DeviceRequest("cuda", 1)),
        (" vulkan:0 ", DeviceRequest("vulkan", 0)),
    ],
)
def test_device_flags_parse_and_print_back(text: str, request_: DeviceRequest) -> None:
    assert DeviceRequest.parse(text) == request_
    assert DeviceRequest.parse(str(request_)) == request_


@pytest.mark.parametrize("text", ["gpu", "cuda:x", "cpu:0", "auto:1", "cuda:-1", "cuda:9999", "opencl"])
def test_a_bad_device_flag_is_refused_naming_the_kinds(text: str) -> None:
    with pytest.raises(InvalidArgument, match="--device"):
        DeviceRequest.parse(text)


def test_auto_takes_the_first_gpu_else_the_cpu() -> None:
    assert choose_device(AUTO, (CUDA0, CUDA1)) == CUDA0
    assert choose_device(AUTO, ()) == CPU
    assert choose_device(DeviceRequest("cpu"), (CUDA0,)) == CPU


def test_an_index_counts_devices_of_its_kind() -> None:
    offered = (VULKAN0, CUDA0, CUDA1)
    assert choose_device(DeviceRequest("cuda", 1), offered) == CUDA1
    assert choose_device(DeviceRequest("cuda"), offered) == CUDA0
    assert choose_device(DeviceRequest("vulkan"), offered) == VULKAN0


def test_a_missing_device_is_refused_never_replaced() -> None:
    """A worker asked for a GPU it lacks must not quietly serve on the CPU (another recipe)."""
    with pytest.raises(FailedPrecondition, match=r"cuda:2.*CUDA0|cuda:2.*NVIDIA H200"):
        choose_device(DeviceRequest("cuda", 2), (CUDA0, CUDA1))
    with pytest.raises(FailedPrecondition, match=r"GPUs offered: none.*MESHNET_BACKEND=metal"):
        choose_device(DeviceRequest("metal"), ())


def test_the_numerics_class_names_the_device_model_and_is_empty_on_the_cpu() -> None:
    assert CPU.numerics_class == ""
    assert CUDA0.numerics_class == "cuda:NVIDIA H200"
    assert CUDA0.numerics_class != CUDA1.numerics_class


def test_device_values_off_the_wire_are_bounded() -> None:
    with pytest.raises(InvalidArgument):
        DeviceInfo("tpu", 0, "TPU0", "", 0, 0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        DeviceInfo("cuda", 0, "CUDA0", "x" * 300, 0, 0)


def test_a_routes_drift_bound_adds_its_hops_drifts() -> None:
    one = DeviceDrift(top1_agreement=0.9, max_abs_logit_diff=0.5, positions=16)
    two = DeviceDrift(top1_agreement=0.95, max_abs_logit_diff=0.25, positions=12)
    assert route_drift((None, None)) is None
    assert route_drift((one, None)) == one
    both = route_drift((one, two))
    assert both is not None
    assert (both.top1_agreement, both.max_abs_logit_diff, both.positions) == (pytest.approx(0.85), 0.75, 12)


def test_only_a_family_fingerprint_makes_a_route_mixed() -> None:
    drift = DeviceDrift(top1_agreement=1.0, max_abs_logit_diff=0.0625, positions=16)
    assert route_numerics("rcp-" + "0" * 32, (drift,)) == "exact"
    assert route_numerics("rcf-" + "0" * 32, (drift, None)) == "mixed (top-1 agreement 1.000, max |logit diff| 0.0625)"
    with pytest.raises(InvalidArgument):
        DeviceDrift(top1_agreement=1.5, max_abs_logit_diff=0.0, positions=1)


def test_a_gpu_taking_every_layer_plans_within_its_device_memory() -> None:
    """``--layers auto`` and the capacity plan fit a GPU worker's range to the device first."""
    gib = 2**30
    assert placement_budget(4 * gib, CPU, None) == 4 * gib  # the CPU: host memory, as before
    assert placement_budget(None, CPU, None) is None
    on_device = int(CUDA1.memory_free * DEVICE_HEADROOM)
    assert placement_budget(None, CUDA1, None) == on_device
    assert placement_budget(64 * gib, CUDA1, None) == on_device  # the smaller of the two
    assert placement_budget(4 * gib, CUDA1, None) == 4 * gib
    # Some layers left on the CPU live in host memory: the host budget plans them.
    assert placement_budget(64 * gib, CUDA1, 10) == 64 * gib
