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

from meshnet.core.checks import check_count, check_text
from meshnet.core.errors import FailedPrecondition, InvalidArgument

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
