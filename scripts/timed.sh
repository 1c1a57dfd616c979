#!/usr/bin/env bash
# Run one step of a make target and print how long it took, also when it fails: `make test` has a
# time budget, and these lines (with pytest's "wall time per phase") say where it went.
# Usage: bash scripts/timed.sh LABEL COMMAND [ARG...]
label=$1
shift
start=$(date +%s)
"$@"
rc=$?
echo "[time] $label: $(( $(date +%s) - start )) s (exit status $rc)"
exit $rc
