#!/usr/bin/env sh
# Which CPU a native llama.cpp build here is for, as a short fingerprint: a build is only good on
# a CPU with the same one.
#
# llama.cpp builds with -march=native, so its kernels use every instruction this CPU has (AVX-512,
# AVX-VNNI, ...). A virtual environment carried to another machine (a copied checkout, a CI run
# that starts from the session's tree) keeps that build, and the first kernel the new CPU lacks
# kills the process with SIGILL: this project's CI died so at 491 s ("Illegal instruction" in
# pytest's own process) on a tree whose venv was built on a Xeon with AVX-512 FP16. The fingerprint is
# the compiler's own expansion of -march=native (the -march/-m flags it hands cc1: the ISA, not
# cache sizes, which differ between VMs of one CPU), with the machine name and the extra flags of
# scripts/llama_cflags.sh; the Makefile and scripts/build_backend.sh rebuild when it changes.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
compiler="${CC:-cc}"
if command -v "$compiler" >/dev/null 2>&1; then
    # gcc hands cc1 -march=<cpu> -m<feature> -mno-<feature>; clang hands it -target-feature
    # +<feature> pairs. Keep those words only, in a stable order.
    target="$("$compiler" -march=native -### -E -x c - </dev/null 2>&1 | tr ' ' '\n' | tr -d "'\"" |
        grep -E '^(-m[a-z0-9]|\+[a-z0-9])' | grep -v -E '^-mtune' | sort -u | tr '\n' ' ')"
else
    target="$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || true)"
fi
if command -v sha256sum >/dev/null 2>&1; then digest="sha256sum"; else digest="shasum -a 256"; fi
printf '%s %s %s' "$(uname -m)" "$target" "$("$here/llama_cflags.sh")" | $digest | cut -c1-16
