#!/usr/bin/env bash
# Build llama-cpp-python (llama.cpp, the CPU reference chapter 06 measures beside its ladder) into
# $VENV. Called by scripts/setup.sh; never fails the setup: whatever happens is written to
# $VENV/llamacpp-status.json (status installed / failed / skipped, the reason, the build time),
# which helpers.llamacpp reads, so a missing build gives a reason in the chapter and nothing else.
#
#   WORKBOOK_LLAMACPP=auto (default)  build where a C++ compiler is present, unless the venv reuses
#                                     an image's torch (USE_SYSTEM_TORCH=1: an NPU/CUDA machine)
#   WORKBOOK_LLAMACPP=1               build it there too
#   WORKBOOK_LLAMACPP=0               skip it (the chapter's llama.cpp row then says so)
#   SETUP_DRY_RUN=1                   print the pip command instead of running it
#
# Two phases, so the compile runs while pip installs the rest (scripts/setup.sh starts the first in
# the background as soon as the venv exists): `setup_llamacpp.sh wheel` only builds the wheel into
# $VENV/llamacpp-wheel/ (pip wheel, nothing installed; the outcome in llamacpp-wheel/built), and
# `setup_llamacpp.sh` (install) installs that wheel when it is there, else builds and installs as one step.
#
# The build compiles llama.cpp for this CPU (-march=native) and takes minutes on 2 cores. pip keeps
# the wheel it built in its wheel cache (~/.cache/pip), so a fresh clone on the same machine
# installs it in seconds. That cache is not keyed by CPU: a home directory shared with a machine of
# another CPU class needs `pip cache remove llama_cpp_python` there (the chapter names a wheel that
# dies with an illegal instruction).
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:-install}
case "$PHASE" in
  wheel|install) ;;
  *) echo "usage: scripts/setup_llamacpp.sh [wheel|install]" >&2; exit 2 ;;
esac

VENV=${VENV:-.venv}
WANT=0.3.36
MODE=${WORKBOOK_LLAMACPP:-auto}
STATUS="$VENV/llamacpp-status.json"
LOG="$VENV/llamacpp-build.log"
WHEELS="$VENV/llamacpp-wheel"
# Only what the Python bindings load (libllama and ggml): no multimodal (mtmd/LLaVA) library, no
# llama.cpp "common" library (llama-cpp-python forces it on; scripts/llamacpp-no-common.cmake turns it
# off again right after llama.cpp's project() call), and only the llama target. Tests, examples,
# tools and the server are off in a subproject build anyway. Measured on the 2-core machine this
# halves the build's CPU time (188 s against 442 s for the default build, user + system).
CMAKE_FLAGS="-DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/scripts/llamacpp-no-common.cmake"
TARGETS="llama"

write_status() {  # status reason build_s
  [ "${SETUP_DRY_RUN:-0}" = "1" ] && return 0
  "$VENV/bin/python" - "$STATUS" "$1" "$2" "${3:-}" "$WANT" <<'PY'
import json, sys, time
path, status, reason, build_s, want = sys.argv[1:6]
data = {"status": status, "reason": reason, "version": want, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
if build_s:
    data["build_s"] = float(build_s)
with open(path, "w") as fh:
    json.dump(data, fh, indent=1)
PY
}

case "$MODE" in
  0|off|no)
    echo "setup: llama.cpp skipped (WORKBOOK_LLAMACPP=$MODE)"
    write_status skipped "WORKBOOK_LLAMACPP=$MODE"
    exit 0 ;;
  auto)
    if [ "${USE_SYSTEM_TORCH:-0}" = "1" ]; then
      echo "setup: llama.cpp skipped on an image with its own torch (WORKBOOK_LLAMACPP=1 builds it)"
      write_status skipped "the venv reuses an accelerator image's torch; WORKBOOK_LLAMACPP=1 builds it"
      exit 0
    fi ;;
  1) ;;
  *) echo "setup: WORKBOOK_LLAMACPP=$MODE is not valid; use auto, 1 or 0 (llama.cpp skipped)" >&2
     write_status skipped "WORKBOOK_LLAMACPP=$MODE is not valid (auto, 1 or 0)"
     exit 0 ;;
esac

have=$("$VENV/bin/python" -c "from importlib import metadata; print(metadata.version('llama_cpp_python'))" 2>/dev/null || true)
if [ "$have" = "$WANT" ]; then
  [ -f "$STATUS" ] || write_status installed "already installed"
  exit 0
fi

compiler=""
for cxx in "${CXX:-}" c++ g++ clang++; do
  if [ -n "$cxx" ] && command -v "$cxx" >/dev/null 2>&1; then compiler=$cxx; break; fi
done
if [ -z "$compiler" ]; then
  echo "setup: llama.cpp skipped: no C++ compiler (c++, g++ or clang++) on PATH"
  write_status skipped "no C++ compiler (c++, g++ or clang++) on PATH"
  exit 0
fi

if [ "$PHASE" = "wheel" ]; then
  [ "${SETUP_DRY_RUN:-0}" = "1" ] && exit 0
  rm -rf "$WHEELS"; mkdir -p "$WHEELS"
  start=$(date +%s)
  CMAKE_ARGS="$CMAKE_FLAGS" SKBUILD_BUILD_TARGETS="$TARGETS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}" \
    "$VENV/bin/python" -m pip wheel -q --no-deps -w "$WHEELS" "llama-cpp-python==$WANT" >"$LOG" 2>&1
  echo "$? $(( $(date +%s) - start ))" > "$WHEELS/built"
  exit 0
fi

cmd=("$VENV/bin/python" -m pip install -q "llama-cpp-python==$WANT")
built=""
if [ -f "$WHEELS/built" ] && read -r rc wheel_s < "$WHEELS/built" && [ "$rc" = "0" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  # the wheel the first phase built beside pip's install of the rest; pip resolves its dependencies
  cmd=("$VENV/bin/python" -m pip install -q --find-links "$WHEELS" "llama-cpp-python==$WANT")
  built=" (its wheel built in ${wheel_s} s beside the rest of the setup)"
fi
if [ "${SETUP_DRY_RUN:-0}" = "1" ]; then
  printf '+ CMAKE_ARGS=%q SKBUILD_BUILD_TARGETS=%q' "$CMAKE_FLAGS" "$TARGETS"; printf ' %q' "${cmd[@]}"; printf '\n'
  exit 0
fi
[ -n "$built" ] || echo "setup: building llama-cpp-python $WANT with $compiler (minutes on 2 cores; pip caches the wheel; log: $LOG)"
start=$(date +%s)
if CMAKE_ARGS="$CMAKE_FLAGS" SKBUILD_BUILD_TARGETS="$TARGETS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}" \
    "${cmd[@]}" >>"$LOG" 2>&1; then
  took=$(( $(date +%s) - start ))
  echo "setup: llama-cpp-python $WANT installed in ${took} s$built"
  write_status installed "built or taken from pip's wheel cache in ${took} s$built" "$(( took + ${wheel_s:-0} ))"
  rm -rf "$WHEELS"
else
  took=$(( $(date +%s) - start ))
  why=$(grep -m1 -E "CMake Error|error:|ERROR:" "$LOG" | cut -c1-300)
  echo "setup: llama-cpp-python $WANT failed to install after ${took} s (the workbook runs without it): ${why:-see $LOG}"
  write_status failed "pip install failed after ${took} s: ${why:-see $LOG}" "$took"
fi
exit 0
