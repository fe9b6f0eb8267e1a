"""The boundary-capture eval callback, in C.

llama.cpp calls the eval callback for every node of the graph (hundreds per decode step). As a
Python callback each call must take the GIL, which a worker's event loop also wants, so a
Python callback costs milliseconds per step under load. This tiny C callback does the same
work (match ``l_out-N`` by name, copy it out) without Python. It is compiled once per
llama-cpp-python build with the system C compiler and linked against the wheel's own
libggml-base; where no compiler is available the Python callback is used instead.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import llama_cpp

log = logging.getLogger(__name__)

SOURCE = r"""
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
struct ggml_tensor;
const char * ggml_get_name(const struct ggml_tensor * tensor);
size_t ggml_nbytes(const struct ggml_tensor * tensor);
void ggml_backend_tensor_get(const struct ggml_tensor * tensor, void * data, size_t offset, size_t size);

struct meshnet_capture {
    char target[64];
    char * buffer;
    size_t capacity;
    size_t used;
    int overflow;
};

bool meshnet_capture_eval(struct ggml_tensor * tensor, bool ask, void * user_data) {
    struct meshnet_capture * capture = (struct meshnet_capture *) user_data;
    if (strcmp(ggml_get_name(tensor), capture->target) != 0) {
        return !ask;
    }
    if (ask) {
        return true;
    }
    size_t size = ggml_nbytes(tensor);
    if (capture->used + size > capture->capacity) {
        capture->overflow = 1;
        return false;
    }
    ggml_backend_tensor_get(tensor, capture->buffer + capture->used, 0, size);
    capture->used += size;
    return true;
}
"""


class CaptureState(ctypes.Structure):
    _fields_ = [
        ("target", ctypes.c_char * 64),
        ("buffer", ctypes.c_void_p),
        ("capacity", ctypes.c_size_t),
        ("used", ctypes.c_size_t),
        ("overflow", ctypes.c_int),
    ]


def _lib_dir() -> Path:
    return Path(llama_cpp.__file__).parent / "lib"


def load_native_capture() -> ctypes.CDLL | None:
    """The compiled callback library, building it on first use; None if it cannot be built."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    key = hashlib.sha256((SOURCE + llama_cpp.__version__ + str(_lib_dir())).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"meshnet-native-{os.getuid()}"
    target = folder / f"capture-{key}.so"
    if not target.exists():
        if compiler is None:
            log.warning("no C compiler: using the slower Python boundary callback")
            return None
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as work:
            source = Path(work) / "capture.c"
            source.write_text(SOURCE)
            built = Path(work) / "capture.so"
            command = [
                compiler,
                "-O2",
                "-shared",
                "-fPIC",
                str(source),
                "-o",
                str(built),
                f"-L{_lib_dir()}",
                "-lggml-base",
                f"-Wl,-rpath,{_lib_dir()}",
            ]
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                log.warning(
                    "could not build the native boundary callback (%s); using Python", result.stderr.strip()[:200]
                )
                return None
            os.replace(built, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as error:
        log.warning("could not load the native boundary callback (%s); using Python", error)
        return None


@functools.cache
def native_capture() -> ctypes.CDLL | None:
    """``load_native_capture`` once per process, on first use: every engine of the process shares
    the one build (None: no compiler, the Python callback is used)."""
    return load_native_capture()
