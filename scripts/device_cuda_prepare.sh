#!/usr/bin/env bash
# Prepare what a CUDA device check carries to a machine with no network (scripts/device_cuda.sh):
#   .gpu/llama_cpp_python-0.3.36.tar.gz  the pinned sdist without its .git, vocab GGUFs, docs,
#                                         examples and tests (76 MB -> 11 MB; the build needs none)
#   .gpu/whl/                             cp312 wheels of meshnet's runtime pins the image lacks
# .gpu/ is git-ignored by this script (.git/info/exclude). Run here, then carry `.gpu`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
cd "$ROOT"
mkdir -p .git/info .gpu/whl
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
grep -qx "/.gpu-build/" .git/info/exclude 2>/dev/null || echo "/.gpu-build/" >> .git/info/exclude
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$WORK"
tar -xzf "$WORK/llama_cpp_python-0.3.36.tar.gz" -C "$WORK"
V="$WORK/llama_cpp_python-0.3.36/vendor/llama.cpp"
rm -rf "$WORK/llama_cpp_python-0.3.36/.git" "$V/.git" "$V"/models/*.gguf "$V/docs" "$V/benches" "$V/examples" \
    "$V/tests" "$V/media" "$V/gguf-py" "$V"/tools/server/public*
tar -czf .gpu/llama_cpp_python-0.3.36.tar.gz -C "$WORK" llama_cpp_python-0.3.36
# Resolved for CPython 3.12 on manylinux; what the device image already holds is dropped again.
"$PY" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_34_x86_64 -d .gpu/whl gguf==0.19.0 grpcio==1.85.1 grpcio-health-checking==1.85.1 \
    protobuf==7.36.2 fastapi==0.165.0 uvicorn==0.54.0 pydantic==2.14.4 prometheus-client==0.26.0 \
    psutil==7.2.2 jsonschema==4.26.0 jinja2==3.1.6 cryptography==50.0.2 diskcache==5.6.3
(cd .gpu/whl && rm -f numpy-* pygments-* requests-* urllib3-* charset_normalizer-* certifi-* click-* \
    packaging-* pyyaml-* tqdm-* idna-* h11-* httpcore-* httpx-* anyio-* attrs-* typing_extensions-*)
du -sh .gpu/llama_cpp_python-0.3.36.tar.gz .gpu/whl
