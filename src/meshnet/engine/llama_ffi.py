"""The small part of the llama.cpp / ggml C API that llama-cpp-python does not wrap for us.

``llama_cpp`` is imported only in the engine; this module adds the three ggml calls the
boundary capture needs (tensor name, size, device-to-host copy), bound from the very
libggml-base the pinned wheel ships, so they always match the running llama.cpp.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import _logger as llama_logger

from meshnet.core.errors import ArtifactError

# Keep llama.cpp's model-loading chatter out of our output; errors still show.
llama_logger.logger.setLevel(logging.ERROR)


def _load(library: str) -> ctypes.CDLL:
    """One of the wheel's own ggml libraries (``ggml-base``: tensors; ``ggml``: the registry)."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in (f"lib{library}.so", f"lib{library}.dylib", f"{library}.dll"):
        if (lib_dir / name).exists():
            return ctypes.CDLL(str(lib_dir / name))
    raise OSError(f"lib{library} not found in {lib_dir}")


def _bind(library: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    function = getattr(library, name)
    function.argtypes = list(argtypes)
    function.restype = restype
    return function


_base, _registry = _load("ggml-base"), _load("ggml")
_P, _SIZE = ctypes.c_void_p, ctypes.c_size_t
ggml_get_name = _bind(_base, "ggml_get_name", ctypes.c_char_p, _P)
ggml_nbytes = _bind(_base, "ggml_nbytes", _SIZE, _P)
ggml_backend_tensor_get = _bind(_base, "ggml_backend_tensor_get", None, _P, _P, _SIZE, _SIZE)
ggml_backend_dev_count = _bind(_registry, "ggml_backend_dev_count", _SIZE)
ggml_backend_dev_get = _bind(_registry, "ggml_backend_dev_get", _P, _SIZE)
ggml_backend_dev_name = _bind(_base, "ggml_backend_dev_name", ctypes.c_char_p, _P)
ggml_backend_dev_description = _bind(_base, "ggml_backend_dev_description", ctypes.c_char_p, _P)
ggml_backend_dev_type = _bind(_base, "ggml_backend_dev_type", ctypes.c_int, _P)
ggml_backend_dev_memory = _bind(
    _base, "ggml_backend_dev_memory", None, _P, ctypes.POINTER(_SIZE), ctypes.POINTER(_SIZE)
)
ggml_backend_dev_backend_reg = _bind(_base, "ggml_backend_dev_backend_reg", _P, _P)
ggml_backend_reg_name = _bind(_base, "ggml_backend_reg_name", ctypes.c_char_p, _P)
GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_ACCEL = 3
"""ggml-backend.h's ``enum ggml_backend_dev_type``: CPU, GPU, IGPU, ACCEL, META."""

EvalCallback = llama_cpp.ggml_backend_sched_eval_callback
LLAMA_CPP_PYTHON_VERSION: str = llama_cpp.__version__


def load_vocabulary(model_path: Path) -> llama_cpp.llama_model_p | None:
    """A ``vocab_only`` load of a GGUF (no tensors): for tokenizers and grammar matchers.
    The caller frees it with ``llama_cpp.llama_model_free``."""
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
    if not model:
        raise ArtifactError(f"llama.cpp could not load the vocabulary of {Path(model_path).name}")
    return model
