"""The devices this llama.cpp build offers, read from ggml's backend registry, and the handles a
context is placed on. The choice among them is ``core.devices.choose_device`` (pure)."""

from __future__ import annotations

import ctypes
import os

import llama_cpp

from meshnet.core.devices import CPU, DeviceInfo, DeviceKind, DeviceRequest, choose_device
from meshnet.core.errors import FailedPrecondition
from meshnet.engine.llama_ffi import (
    GGML_BACKEND_DEVICE_TYPE_ACCEL,
    GGML_BACKEND_DEVICE_TYPE_CPU,
    ggml_backend_dev_backend_reg,
    ggml_backend_dev_count,
    ggml_backend_dev_description,
    ggml_backend_dev_get,
    ggml_backend_dev_memory,
    ggml_backend_dev_name,
    ggml_backend_dev_type,
    ggml_backend_reg_name,
)

EXACT_SPLIT_SWITCHES = {
    "GGML_VK_DISABLE_FUSION": "1",
    "GGML_CUDA_DISABLE_FUSION": "1",
    "GGML_METAL_FUSION_DISABLE": "1",
}
"""GPU backends fuse neighbouring ops (an add into the next RMS norm, say) where nothing reads
the tensor between them. A shard's boundary capture reads ``l_out`` there (the eval callback
splits the graph at it), so the whole model would fuse where its split cannot, and round
differently: measured on Vulkan (lavapipe), decode logits 3.8e-6 apart with fusion, bitwise equal
without. llama.cpp reads these switches when a device is first initialized, so they are set
before the registry is read; certification on the device then proves the result."""

_KINDS: dict[str, DeviceKind] = {"cuda": "cuda", "rocm": "rocm", "metal": "metal", "vulkan": "vulkan"}
"""ggml backend registry names (lower-cased) of the GPU kinds meshnet serves on."""


def offered_devices() -> tuple[DeviceInfo, ...]:
    """The build's GPUs, in registry order and counted per kind; the CPU is always there too."""
    return tuple(device for device, _ in _enumerate())


def find_device(request: DeviceRequest) -> DeviceInfo:
    """The device ``request`` names on this build (``core.devices.choose_device``)."""
    return choose_device(request, offered_devices())


def loaded_device(device: DeviceInfo) -> DeviceInfo:
    """``device`` as the build sees it now (its free memory with an engine loaded on it)."""
    if not device.is_gpu:
        return device
    return next((d for d in offered_devices() if (d.kind, d.index) == (device.kind, device.index)), device)


def device_handle(device: DeviceInfo) -> ctypes.c_void_p:
    """ggml's handle of ``device`` (a GPU), to place a model on."""
    for info, handle in _enumerate():
        if (info.kind, info.index) == (device.kind, device.index):
            return handle
    raise FailedPrecondition(f"device {device} is no longer offered by this build")


def _enumerate() -> list[tuple[DeviceInfo, ctypes.c_void_p]]:
    os.environ.update(EXACT_SPLIT_SWITCHES)
    llama_cpp.llama_backend_init()
    found: list[tuple[DeviceInfo, ctypes.c_void_p]] = []
    per_kind: dict[DeviceKind, int] = {}
    for position in range(ggml_backend_dev_count()):
        handle = ggml_backend_dev_get(position)
        if ggml_backend_dev_type(handle) in (GGML_BACKEND_DEVICE_TYPE_CPU, GGML_BACKEND_DEVICE_TYPE_ACCEL):
            continue  # the CPU (and CPU-side accelerators such as BLAS) is the host, not a device
        kind = _KINDS.get(ggml_backend_reg_name(ggml_backend_dev_backend_reg(handle)).decode().lower())
        if kind is None:
            continue  # a backend meshnet does not certify (SYCL, OpenCL, ...): never chosen
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        index = per_kind.get(kind, 0)
        per_kind[kind] = index + 1
        info = DeviceInfo(
            kind,
            index,
            ggml_backend_dev_name(handle).decode(errors="replace")[:256],
            (ggml_backend_dev_description(handle) or b"").decode(errors="replace")[:256],
            int(total.value),
            int(free.value),
        )
        found.append((info, ctypes.c_void_p(handle)))
    return found


__all__ = ["CPU", "device_handle", "find_device", "loaded_device", "offered_devices"]
