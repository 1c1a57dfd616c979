"""After `make test-legacy`: did the notebooks really run under the legacy set?

Reads chapter 00's results.json of the run folder and exits 1 unless the kernel reported the
transformers of requirements-legacy.txt (a kernel from another venv would not).
Usage: python scripts/check_legacy_run.py reports/<run-id>
"""
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def legacy_pins():
    pins = {}
    for line in (REPO / "requirements-legacy.txt").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    results = Path(argv[0]) / "00_environment_check" / "results.json"
    if not results.exists():
        print(f"error: {results} does not exist (did chapter 00 run?)", file=sys.stderr)
        return 1
    environment = json.loads(results.read_text()).get("environment", {})
    pins = legacy_pins()
    wrong = [f"{name} {environment.get(name)!r} (pinned {pins[name]})" for name in ("transformers",)
             if environment.get(name) != pins[name]]
    if wrong:
        print("error: chapter 00 did not run under the legacy set: " + ", ".join(wrong), file=sys.stderr)
        return 1
    print(f"legacy run checked: chapter 00 ran with transformers {environment['transformers']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
