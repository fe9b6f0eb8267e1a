#!/usr/bin/env bash
# Check that every patch in docs/upstream/patches/ applies cleanly to the exact llama.cpp that
# meshnet pins: the vendor/llama.cpp tree inside the llama-cpp-python 0.3.36 source distribution.
#
#   docs/upstream/check_patches.sh [work-dir]
#
# Downloads the sdist with pip (needs network access to PyPI), unpacks it under work-dir (default:
# a new temp dir) and runs `git apply --check` for each patch on the pristine tree, one at a time
# (each patch is a separate proposal). It then reports, for information, whether they also stack in
# order. Not part of `make test`; meshnet never applies these patches.
set -euo pipefail

PIN="llama-cpp-python==0.3.36"
PIN_COMMIT="0c1e57098bba43ac29e6e3b677cdceebdd22334f"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PATCHES=("$HERE"/patches/*.patch)
WORK="${1:-$(mktemp -d -t meshnet-upstream-XXXXXX)}"
PYTHON="${PYTHON:-python3}"

mkdir -p "$WORK"
if ! ls "$WORK"/llama_cpp_python-0.3.36.tar.gz > /dev/null 2>&1; then
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "$PIN" -d "$WORK"
fi
rm -rf "$WORK/src" && mkdir -p "$WORK/src"
tar -xzf "$WORK"/llama_cpp_python-0.3.36.tar.gz -C "$WORK/src"
TREE="$WORK/src/llama_cpp_python-0.3.36/vendor/llama.cpp"
echo "pinned llama.cpp tree: $TREE"
if head="$(git -C "$TREE" rev-parse HEAD 2> /dev/null)"; then
    echo "commit: $head"
    [ "$head" = "$PIN_COMMIT" ] || { echo "FAIL: the sdist vendors $head, not the pinned $PIN_COMMIT"; exit 1; }
fi
# Apply in plain copies (no .git link back into the sdist's submodule metadata), so git apply
# works on files alone, as `patch -p1` would.
PRISTINE="$WORK/pristine" && rm -rf "$PRISTINE" && cp -r "$TREE" "$PRISTINE" && rm -rf "$PRISTINE/.git"

failed=0
for patch in "${PATCHES[@]}"; do
    if (cd "$PRISTINE" && git apply --check "$patch" 2> "$WORK/apply.err"); then
        echo "ok    $(basename "$patch")"
    else
        echo "FAIL  $(basename "$patch")"; sed 's/^/      /' "$WORK/apply.err"; failed=1
    fi
done

# Information only: do the proposals also apply one after another?
STACK="$WORK/stack" && rm -rf "$STACK" && cp -r "$PRISTINE" "$STACK"
stacked=1
for patch in "${PATCHES[@]}"; do
    (cd "$STACK" && git apply "$patch" 2> /dev/null) || { echo "note: $(basename "$patch") does not stack on the ones before it"; stacked=0; }
done
[ "$stacked" = 1 ] && echo "note: all patches also apply together, in order"

if [ "$failed" = 0 ]; then
    echo "PASS: ${#PATCHES[@]} patches apply cleanly to $PIN (llama.cpp $PIN_COMMIT)"
else
    echo "FAIL: some patches do not apply to $PIN"
    exit 1
fi
