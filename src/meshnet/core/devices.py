"""Where a worker computes: the device kinds, a user's request for one, and the choice among what
the build offers. Pure values and decisions; ``engine.devices`` reads what llama.cpp offers.

A device's *class* is part of a recipe (``Recipe.backend``): llama.cpp picks kernels by backend,
device model and driver or compute capability, so two shards of different classes compute
different numbers and only form an exact route when they are of one class. The CPU's class is
empty, so every CPU recipe keeps the fingerprint it had before GPUs existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from meshnet.core.checks import check_count, check_finite, check_text
from meshnet.core.errors import FailedPrecondition, InvalidArgument
from meshnet.core.recipe import FAMILY_PREFIX

DeviceKind = Literal["cpu", "cuda", "metal", "vulkan", "rocm"]
DEVICE_KINDS: tuple[DeviceKind, ...] = get_args(DeviceKind)
MAX_DEVICE_INDEX = 255
MAX_DEVICE_BYTES = 1 << 50


@dataclass(frozen=True)
class DeviceRequest:
    """What ``--device`` asked for: ``auto``, a kind, or a kind and its index (``cuda:1``)."""

    kind: DeviceKind | Literal["auto"] = "auto"
    index: int | None = None
    """Among the build's devices of ``kind``, counted from 0; None takes the first."""

    @classmethod
    def parse(cls, text: str) -> DeviceRequest:
        kind, _, index = text.strip().lower().partition(":")
        if kind != "auto" and kind not in DEVICE_KINDS:
            raise InvalidArgument(
                f"--device must be auto or one of {', '.join(DEVICE_KINDS)} (e.g. cuda:1), got {text!r}"
            )
        if not index:
            return cls(kind)  # type: ignore[arg-type]
        if kind in ("auto", "cpu") or not index.isdigit() or int(index) > MAX_DEVICE_INDEX:
            raise InvalidArgument(f"--device {text!r}: only a GPU kind takes an index in [0, {MAX_DEVICE_INDEX}]")
        return cls(kind, int(index))  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


AUTO = DeviceRequest()
"""``--device auto``: the build's first GPU, else the CPU."""


@dataclass(frozen=True)
class DeviceInfo:
    """One device the build offers, as llama.cpp describes it."""

    kind: DeviceKind
    index: int
    """Among the build's devices of this kind, from 0."""
    name: str
    """The backend's name for it (``Vulkan0``, ``CUDA1``, ``CPU``)."""
    description: str
    """The device model as the driver reports it (``NVIDIA H200``, ``llvmpipe (LLVM 15.0.6, 256 bits)``)."""
    memory_total: int
    memory_free: int

    def __post_init__(self) -> None:
        if self.kind not in DEVICE_KINDS:
            raise InvalidArgument(f"device kind must be one of {DEVICE_KINDS}, got {self.kind!r}")
        check_count("device index", self.index, MAX_DEVICE_INDEX)
        check_text("device name", self.name)
        check_text("device description", self.description, allow_empty=True)
        check_count("device memory_total", self.memory_total, MAX_DEVICE_BYTES)
        check_count("device memory_free", self.memory_free, MAX_DEVICE_BYTES)

    @property
    def is_gpu(self) -> bool:
        return self.kind != "cpu"

    @property
    def numerics_class(self) -> str:
        """What selects this device's kernels, for the recipe: empty on the CPU (its kernels are
        named by the build already), else the kind and the device model."""
        return "" if self.kind == "cpu" else f"{self.kind}:{self.description or self.name}"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.index} ({self.description or self.name})"


CPU = DeviceInfo("cpu", 0, "CPU", "", 0, 0)
"""The host CPU: always there, whatever the build."""


def choose_device(request: DeviceRequest, offered: tuple[DeviceInfo, ...]) -> DeviceInfo:
    """The device ``request`` names among ``offered`` (the build's GPUs; the CPU is implied).

    ``auto`` takes the first GPU, else the CPU. A named kind the build lacks, or an index past
    what it has, is refused naming what there is: a worker never falls back to another device
    silently, since that would change its recipe."""
    if request.kind == "cpu":
        return CPU
    if request.kind == "auto":
        return next((device for device in offered if device.is_gpu), CPU)
    matching = [device for device in offered if device.kind == request.kind]
    wanted = request.index or 0
    if wanted < len(matching):
        return matching[wanted]
    there = ", ".join(str(device) for device in offered if device.is_gpu) or "none"
    raise FailedPrecondition(
        f"--device {request}: this build of llama.cpp offers no such device (GPUs offered: {there}); "
        f"build one with MESHNET_BACKEND={request.kind} (see the README)"
    )


@dataclass(frozen=True)
class DeviceDrift:
    """How far a device's numbers are from the CPU's on the synthetic model, measured through the
    mixed splits its worker can run (``engine.device_drift``): the evidence a mixed route needs."""

    top1_agreement: float
    """Fraction of compared positions whose most likely token is the CPU's."""
    max_abs_logit_diff: float
    """Largest |logit difference| from the CPU's whole model over every compared logit."""
    positions: int
    """Positions compared (prefill rows and greedy decode steps)."""

    def __post_init__(self) -> None:
        check_finite("drift top1_agreement", self.top1_agreement, high=1.0)
        check_finite("drift max_abs_logit_diff", self.max_abs_logit_diff, high=1e9)
        check_count("drift positions", self.positions, 1 << 20, low=1)

    def __str__(self) -> str:
        return f"top-1 agreement {self.top1_agreement:.3f}, max |logit diff| {self.max_abs_logit_diff:.3g}"


def route_drift(drifts: tuple[DeviceDrift | None, ...]) -> DeviceDrift | None:
    """The drift a route of these hops' devices is labelled with (None: every hop on the CPU's
    numbers, or a hop's device unmeasured). Logit differences add along a route at worst (each
    measured against the same CPU reference); agreement is at least the worst hop's less what
    the others can disagree."""
    measured = [drift for drift in drifts if drift is not None]
    if not measured:
        return None
    disagreement = sum(1.0 - drift.top1_agreement for drift in measured)
    return DeviceDrift(
        top1_agreement=max(0.0, 1.0 - disagreement),
        max_abs_logit_diff=sum(drift.max_abs_logit_diff for drift in measured),
        positions=min(drift.positions for drift in measured),
    )


def route_numerics(fingerprint: str, drifts: tuple[DeviceDrift | None, ...]) -> str:
    """What a route's numbers are, for the request's telemetry: ``exact`` (one recipe: any split
    equals that device's whole model) or ``mixed`` with the drift its hops measured."""
    if not fingerprint.startswith(FAMILY_PREFIX):
        return "exact"
    drift = route_drift(drifts)
    return "mixed" if drift is None else f"mixed ({drift})"


DEVICE_HEADROOM = 0.9
"""Share of a GPU's free memory a range may plan to fill: the backend's own buffers, the driver
and the display take the rest."""


def placement_budget(host_budget: int | None, device: DeviceInfo, gpu_layers: int | None) -> int | None:
    """The bytes a worker's layer range (weights, KV, compute buffers) must fit, for ``--layers
    auto``: on a GPU that takes every layer, its free device memory (``DEVICE_HEADROOM`` of it),
    and the host budget too when one is set; on the CPU, or when only some layers are offloaded
    (the rest live in host memory), the host budget."""
    if not device.is_gpu or gpu_layers is not None or device.memory_free <= 0:
        return host_budget
    on_device = int(device.memory_free * DEVICE_HEADROOM)
    return on_device if host_budget is None else min(host_budget, on_device)
