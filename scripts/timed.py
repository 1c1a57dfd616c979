"""Run one step of a make target, print its wall time against its budget, and guard the budget.

    python3 scripts/timed.py LABEL BUDGET_S COMMAND [ARG...]

``make test`` has a time budget per level (the README's test section): each step prints
``[time] LABEL: 212 s of its 300 s budget (exit status 0)`` and appends the same line to the file
``$WORKBOOK_TIMES`` names, if any, so the last step can print them all (``--summary FILE``).

A step that takes more than 1.5 times its budget fails the target (exit status 3) when the machine was
otherwise idle: that is a regression signal, not a timing assertion. When other processes kept the
CPU busy during the step (on average more than half a core beyond what this step's own processes
used, read from /proc/stat and the step's rusage), it only warns and names the load. BUDGET_S 0
prints the time and checks nothing. Standard library only: it runs before any venv exists.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

OVER = 1.5  # a level fails past this multiple of its budget
LOADED_CORES = 0.5  # other processes' average CPU, in cores, above which the machine counts as loaded


def busy_cpu_seconds() -> float:
    """CPU time all cores spent not idle since boot (/proc/stat); 0.0 where there is none."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def verdict(label: str, wall: float, budget: float, others_cores: float, rc: int) -> tuple[str, int]:
    """The ``[time]`` line and the exit status: ``rc`` unless it is 0 and an idle machine ran over."""
    line = f"[time] {label}: {wall:.0f} s"
    if budget <= 0:
        return f"{line} (exit status {rc})", rc
    line += f" of its {budget:.0f} s budget (exit status {rc})"
    if wall <= OVER * budget:
        return line, rc
    loaded = others_cores > LOADED_CORES
    why = (f"; other processes kept {others_cores:.1f} cores busy meanwhile, so this is only a warning"
           if loaded else f"; the machine was otherwise idle ({others_cores:.1f} cores of other work)")
    line += f"\nBUDGET: {label} took more than {OVER:g} x its budget{why}"
    return line, (rc or (0 if loaded else 3))


def summary(path: str) -> int:
    try:
        lines = [line for line in open(path).read().splitlines() if line.startswith("[time]")]
    except OSError:
        return 0
    # the levels (a step with a budget); a level run twice (.ci/run builds, then make test checks
    # the build again) is shown by its longer run
    levels: dict = {}
    for line in lines:
        if " of its " in line:
            label, seconds = line.split(":", 1)[0], float(line.split(":", 1)[1].split()[0])
            if label not in levels or seconds > levels[label][0]:
                levels[label] = (seconds, line)
    print("--- make test, each level against its budget ---")
    print("\n".join(line for _, line in levels.values()))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--summary":
        return summary(argv[1])
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    label, budget, command = argv[0], float(argv[1]), argv[2:]
    start, busy0, ours0 = time.monotonic(), busy_cpu_seconds(), children_cpu_seconds()
    try:
        rc = subprocess.call(command)
    except KeyboardInterrupt:
        rc = 130
    wall = time.monotonic() - start
    others = max(0.0, (busy_cpu_seconds() - busy0) - (children_cpu_seconds() - ours0))
    line, rc = verdict(label, wall, budget, others / wall if wall > 0 else 0.0, rc)
    print(line, flush=True)
    if os.environ.get("WORKBOOK_TIMES"):
        with open(os.environ["WORKBOOK_TIMES"], "a") as f:
            f.write(line.splitlines()[0] + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
