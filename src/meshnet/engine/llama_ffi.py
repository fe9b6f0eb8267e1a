"""The small part of the llama.cpp / ggml C API that llama-cpp-python does not wrap for us.

``llama_cpp`` is imported only in the engine; this module adds the three ggml calls the
boundary capture needs (tensor name, size, device-to-host copy), bound from the very
libggml-base the pinned wheel ships, so they always match the running llama.cpp.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import llama_cpp
from llama_cpp import _logger as llama_logger

from meshnet.core.errors import ArtifactError

# Keep llama.cpp's model-loading chatter out of our output; errors still show.
llama_logger.logger.setLevel(logging.ERROR)


def _load_ggml_base() -> ctypes.CDLL:
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (lib_dir / name).exists():
            return ctypes.CDLL(str(lib_dir / name))
    raise OSError(f"libggml-base not found in {lib_dir}")


def _load_ggml() -> ctypes.CDLL:
    """libggml: the backend registry (which devices this build offers)."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            return ctypes.CDLL(str(lib_dir / name))
    raise OSError(f"libggml not found in {lib_dir}")


_ggml = _load_ggml_base()
ggml_get_name = _ggml.ggml_get_name
ggml_get_name.argtypes = [ctypes.c_void_p]
ggml_get_name.restype = ctypes.c_char_p
ggml_nbytes = _ggml.ggml_nbytes
ggml_nbytes.argtypes = [ctypes.c_void_p]
ggml_nbytes.restype = ctypes.c_size_t
ggml_backend_tensor_get = _ggml.ggml_backend_tensor_get
ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
ggml_backend_tensor_get.restype = None

_registry = _load_ggml()
ggml_backend_dev_count = _registry.ggml_backend_dev_count
ggml_backend_dev_count.argtypes = []
ggml_backend_dev_count.restype = ctypes.c_size_t
ggml_backend_dev_get = _registry.ggml_backend_dev_get
ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
ggml_backend_dev_get.restype = ctypes.c_void_p
ggml_backend_dev_name = _ggml.ggml_backend_dev_name
ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
ggml_backend_dev_name.restype = ctypes.c_char_p
ggml_backend_dev_description = _ggml.ggml_backend_dev_description
ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
ggml_backend_dev_description.restype = ctypes.c_char_p
ggml_backend_dev_type = _ggml.ggml_backend_dev_type
ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
ggml_backend_dev_type.restype = ctypes.c_int
ggml_backend_dev_memory = _ggml.ggml_backend_dev_memory
ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
ggml_backend_dev_memory.restype = None
ggml_backend_dev_backend_reg = _ggml.ggml_backend_dev_backend_reg
ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
ggml_backend_reg_name = _ggml.ggml_backend_reg_name
ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
ggml_backend_reg_name.restype = ctypes.c_char_p
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
