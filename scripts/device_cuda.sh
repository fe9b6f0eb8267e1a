#!/bin/bash
# The CUDA device check, one command on a lent GPU machine with no network (docs/devices/cuda.md):
#   scripts/device_cuda_prepare.sh            (here: the trimmed sdist and wheels into .gpu/)
#   device run: bash scripts/device_cuda.sh   (carry .gpu; results land in $OUT)
# It builds the pinned llama-cpp-python with -DGGML_CUDA=on for sm_90 into .gpu-build/ (kept while
# the machine stays warm), probes the build step by step (import, devices, certification; a crash
# gets a cuda-gdb backtrace), then runs scripts/device_check.py (split == whole, drift, timings)
# and a real swarm (`meshnet up`, 3 workers on the GPU). MESHNET_PRELOAD_LIBSTDCXX=1 preloads the
# system libstdc++ (the workaround to try for the 2026-12-04 crash, docs/devices/cuda.md).
set -u
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
T0=$(date +%s)
log(){ echo "[$(( $(date +%s)-T0 ))s] $*"; }
ROOT=$PWD; D=${DEVICE:-cuda}
[ -z "${MESHNET_PRELOAD_LIBSTDCXX:-}" ] || export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
nvcc --version | tail -1; nproc; python3 --version
[ -n "${SKIP_WHEELS:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || { log wheels failed; exit 3; }
export PYTHONPATH=/tmp/site
if [ ! -f .gpu-build/done ]; then
  mkdir -p .gpu-build/src && tar -xzf .gpu/llama_cpp_python-0.3.36.tar.gz -C .gpu-build/src
  log build start
  CPU_FLAGS="$(scripts/llama_cflags.sh)"  # no AMX kernels on x86-64 (see the script)
  CFLAGS="$CPU_FLAGS" CXXFLAGS="$CPU_FLAGS" \
  CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=16 \
    timeout ${BUILD_S:-470} python3 -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir \
    --config-settings=build-dir=$ROOT/.gpu-build/cmake --target $ROOT/.gpu-build/llama \
    .gpu-build/src/llama_cpp_python-0.3.36 > /tmp/build.log 2>&1 || { log build failed; tail -40 /tmp/build.log; exit 4; }
  tail -3 /tmp/build.log; touch .gpu-build/done
  log build done
fi
export PYTHONPATH=$ROOT/.gpu-build/llama:/tmp/site:$ROOT/src
ls -la .gpu-build/llama/llama_cpp/lib 2>/dev/null | awk '{print $5, $9}'
probe(){ n=$1; shift; echo "=== probe $n: $*" >> $OUT/probes.log; timeout 150 "$@" >> $OUT/probes.log 2>&1; rc=$?; log "probe $n rc=$rc"; return $rc; }
probe init python3 -c "import llama_cpp; llama_cpp.llama_backend_init(); print('init ok')"
probe enum python3 -c "from meshnet.engine.devices import offered_devices; print(offered_devices())"
probe devices python3 -m meshnet --data-dir /tmp/d devices --no-certify
probe certify python3 -m meshnet --data-dir /tmp/d -v certify --device $D
CRC=$?
grep -v "^llama_model_loader: - \|^print_info\|^load_tensors: \|^llm_load" $OUT/probes.log | tail -60
if [ $CRC -ne 0 ] && command -v cuda-gdb >/dev/null; then
  timeout 120 cuda-gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" --args python3 -m meshnet --data-dir /tmp/d certify --device $D > $OUT/gdb.log 2>&1
  grep -A30 "SIGSEGV\|signal" $OUT/gdb.log | head -50
  probe certify-nographs env GGML_CUDA_DISABLE_GRAPHS=1 python3 -m meshnet --data-dir /tmp/d certify --device $D || exit 5
fi
F='^load|^llama_|^print_info|^llm_load|^\.+$|^ggml_|^graph_|^sched_|^init_|^common_|^set_'
timeout ${CHECK_S:-300} python3 scripts/device_check.py --device $D --out $OUT/device-cuda.json \
  --models ${MODELS:-families,synthetic-1b,synthetic-8b} --work-dir /tmp > $OUT/check.log 2>&1
log "check rc=$?"; grep -Ev "$F" $OUT/check.log | tail -30
python3 -c "
from pathlib import Path
from meshnet.artifact.synthetic import write_synthetic_model; from meshnet.artifact.synthetic_models import tinyllama_shaped_spec
write_synthetic_model(Path('/tmp/m1b.gguf'), tinyllama_shaped_spec())"
P="Write a haiku about machines that share their work."
timeout 60 python3 -m meshnet --data-dir /tmp/d generate --model /tmp/m1b.gguf --shards 1 --device $D --max-tokens 24 "$P" > $OUT/e2e.log 2>&1
timeout 120 python3 -m meshnet --data-dir /tmp/d up --model /tmp/m1b.gguf --shards 3 --demo-only --max-tokens 24 --prompt "$P" --port 18080 >> $OUT/e2e.log 2>&1
log "up rc=$?"; grep -Ev "$F" $OUT/e2e.log | tail -25
log all done
