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
