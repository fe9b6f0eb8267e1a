"""Runtime recipe identity: what must match exactly for shards to form one route.

Two shards may be chained only if every field that affects numerics or the boundary format is
equal, so the fingerprint hashes all of them. The layer range is deliberately *not* part of it:
shards of one recipe with different ranges are exactly what a route combines.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

FAMILY_PREFIX = "rcf-"
"""Starts a recipe family's fingerprint: a route whose frames carry one is a mixed-device route."""
BOUNDARY_SCHEMA = "residual-f32-v1"
"""The seam carries the unnormalized residual after the last owned layer, float32, row-major."""


@dataclass(frozen=True)
class Recipe:
    model_sha256: str
    """sha256 of the whole source GGUF every slice was cut from."""
    architecture: str
    adapter_version: str
    weight_quantization: str
    activation_dtype: str
    kv_dtype: str
    backend: str
    backend_version: str
    """llama-cpp-python version (and so the bundled llama.cpp build)."""
    n_layers: int
    n_embd: int
    boundary_schema: str = BOUNDARY_SCHEMA
    device_class: str = ""
    """The device the layers run on, as far as it selects kernels (``DeviceInfo.numerics_class``
    and how many layers are offloaded); empty on the CPU."""

    def fingerprint(self) -> str:
        fields = asdict(self)
        if not self.device_class:
            del fields["device_class"]  # a CPU recipe keeps the fingerprint it had before GPUs
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return "rcp-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]

    def family_fingerprint(self) -> str:
        """The fingerprint a mixed-device route's frames carry: every device class of this
        family accepts it, and no exact route ever uses it (``rcf-`` against ``rcp-``)."""
        fields = asdict(self)
        del fields["device_class"]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return FAMILY_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:32]

    @property
    def family(self) -> Recipe:
        """This recipe on any device: the recipes a mixed-device route may chain (the same model,
        cut and settings, computed by different kernels)."""
        return replace(self, device_class="")

    @property
    def device_label(self) -> str:
        return self.device_class or "cpu"
