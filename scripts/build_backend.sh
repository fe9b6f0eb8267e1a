#!/usr/bin/env bash
# Build the pinned llama-cpp-python (0.3.36) with a backend into its own virtual environment,
# with the same meshnet source installed editable beside it:
#
#   scripts/build_backend.sh BACKEND VENV          BACKEND: cpu | vulkan | cuda | metal | rocm
#
# The CPU build is the default (`make run`, `make test`, `.venv`: the Makefile calls this with
# `cpu`); `MESHNET_BACKEND=... make run` and the Vulkan tests of `make test` call it with theirs.
# It downloads the pinned sdist from PyPI, applies the numbered build patches of
# docs/upstream/build-patches/ that name the backend, and builds with the backend's CMake switch.
# Extra CMake flags pass through MESHNET_CMAKE_ARGS (e.g. `-DCMAKE_CUDA_ARCHITECTURES=90`). A finished build leaves VENV/.meshnet-backend; a re-run with the
# same backend, pin, patches and CPU (scripts/cpu_target.sh: the build is -march=native) returns at
# once, and a venv carried to another CPU is rebuilt rather than killed by SIGILL.
set -euo pipefail

BACKEND="${1:?usage: build_backend.sh cpu|vulkan|cuda|metal|rocm VENV}"
VENV="${2:?usage: build_backend.sh BACKEND VENV}"
PIN="llama-cpp-python==0.3.36"
SDIST="llama_cpp_python-0.3.36"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

case "$BACKEND" in
    cpu) SWITCH="" ;;
    vulkan) SWITCH="-DGGML_VULKAN=on" ;;
    cuda) SWITCH="-DGGML_CUDA=on" ;;
    metal) SWITCH="-DGGML_METAL=on" ;;
    rocm) SWITCH="-DGGML_HIP=on" ;;
    *) echo "build_backend.sh: unknown backend '$BACKEND' (cpu, vulkan, cuda, metal or rocm)" >&2; exit 2 ;;
esac
PATCHES=()
for patch in "$ROOT"/docs/upstream/build-patches/*-"$BACKEND"-*.patch; do
    [ -e "$patch" ] && PATCHES+=("$patch")
done
# The C/C++ flags every llama.cpp build here gets (x86-64: no AMX kernels; see the script).
CPU_FLAGS="$("$ROOT/scripts/llama_cflags.sh")"
STAMP_TEXT="$BACKEND $PIN $SWITCH ${MESHNET_CMAKE_ARGS:-} $CPU_FLAGS cpu=$("$ROOT/scripts/cpu_target.sh") $(cat "${PATCHES[@]}" /dev/null | sha256sum | cut -c1-16)"
if [ -f "$VENV/.meshnet-backend" ] && [ "$(cat "$VENV/.meshnet-backend")" = "$STAMP_TEXT" ]; then
    echo "llama-cpp-python with $BACKEND is already built in $VENV"
    exit 0
fi
if [ -f "$VENV/.meshnet-backend" ]; then
    echo "rebuilding llama-cpp-python in $VENV: it was built as '$(cat "$VENV/.meshnet-backend")'"
fi

WORK="$(mktemp -d -t meshnet-backend-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" download --quiet --no-deps --no-binary :all: "$PIN" -d "$WORK"
tar -xzf "$WORK/$SDIST.tar.gz" -C "$WORK"
for patch in "${PATCHES[@]}"; do
    echo "applying $(basename "$patch")"
    # The patch files start with a prose header; patch(1) skips it.
    patch --quiet --directory "$WORK/$SDIST/vendor/llama.cpp" -p1 < "$patch"
done
# A build for another CPU goes first: pip would call the same version satisfied and keep it.
"$VENV/bin/pip" uninstall --quiet --yes llama-cpp-python 2>/dev/null || true
echo "building $PIN with $SWITCH ${MESHNET_CMAKE_ARGS:-} $CPU_FLAGS (minutes)"
CFLAGS="$CPU_FLAGS" CXXFLAGS="$CPU_FLAGS" CMAKE_ARGS="$SWITCH ${MESHNET_CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$VENV/bin/pip" install --no-cache-dir "$WORK/$SDIST"
"$VENV/bin/pip" install --quiet -e "$ROOT"
echo "$STAMP_TEXT" > "$VENV/.meshnet-backend"
echo "llama-cpp-python with $BACKEND built in $VENV"
