#!/usr/bin/env sh
# The C and C++ flags every build of the pinned llama.cpp gets on this machine (the CPU build of
# `make` and scripts/build_backend.sh's other backends, all built by that script), printed on one line.
#
# x86-64: no AMX. llama.cpp builds for the CPU it is built on (-march=native); on a Xeon with
# AMX that compiles its AMX matrix kernels in, and at the pinned version those crash the process
# with SIGILL at their first tile instruction (`tilezero`) on Linux, where the kernel hands tile
# state to a thread only after it asked for it (XFD): measured on this project's 2-core VMs
# (Xeon with amx_tile/amx_int8/amx_bf16, kernel 6.18) on the first decode of any model; the
# upstream fix (ggml-org/llama.cpp PR 26954, asking per thread and keeping the tile config off the
# stack) is not in the pin. Explicit -mno- flags win over -march=native whatever their order, so
# the AVX-512/VNNI kernels run instead, the ones every machine without AMX runs.
case "$(uname -m)" in
    x86_64 | amd64) echo "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" ;;
    *) echo "" ;;
esac
