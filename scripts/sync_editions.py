"""Keep the Chinese edition's code the English edition's code.

    python scripts/sync_editions.py          # copy every code cell of notebooks/ and solutions/ into zh/
    python scripts/sync_editions.py --check  # only report differences (exit 1 if any)

An edition is a notebook with the same cells in the same order: the code cells are byte-identical
(the parameters cell included), the markdown cells are the edition's own language. This copies each
English code cell onto the code cell at the same position of the Chinese notebook and leaves its
markdown alone; it refuses a pair whose cell kinds do not line up (a cell was added to or removed
from one edition only: add the translated markdown cell by hand, then run this again).
``tests/test_editions.py`` checks the same pairing, so a code change made in one edition only fails.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("notebooks", "solutions")
EDITION = "zh"


def pairs():
    """(English notebook, Chinese notebook) for every English notebook that has a Chinese edition."""
    for folder in FOLDERS:
        for english in sorted((REPO / folder).glob("*.ipynb")):
            yield english, REPO / folder / EDITION / english.name


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def kinds(nb: dict) -> list[str]:
    return [c["cell_type"] for c in nb["cells"]]


def differences(english: Path, chinese: Path) -> list[str]:
    """What keeps the two notebooks from being one chapter in two languages ([] when in step)."""
    if not chinese.exists():
        return [f"{chinese.relative_to(REPO)} does not exist"]
    en, zh = _load(english), _load(chinese)
    if kinds(en) != kinds(zh):
        return [f"{chinese.name}: cell kinds differ from the English edition ({kinds(en).count('code')} "
                f"code / {kinds(en).count('markdown')} markdown there, {kinds(zh).count('code')} / "
                f"{kinds(zh).count('markdown')} here)"]
    found = []
    for i, (a, b) in enumerate(zip(en["cells"], zh["cells"])):
        if a["cell_type"] == "code":
            if "".join(a["source"]) != "".join(b["source"]):
                found.append(f"{chinese.name}: code cell {i} differs from the English edition")
            if a.get("metadata", {}).get("tags", []) != b.get("metadata", {}).get("tags", []):
                found.append(f"{chinese.name}: code cell {i} has other tags than the English edition")
    return found


def sync(english: Path, chinese: Path) -> bool:
    """Copy the English code cells into the Chinese notebook; False when the cells do not line up."""
    en, zh = _load(english), _load(chinese)
    if kinds(en) != kinds(zh):
        return False
    for a, b in zip(en["cells"], zh["cells"]):
        if a["cell_type"] == "code":
            b["source"], b["metadata"] = a["source"], a.get("metadata", {})
            b["outputs"], b["execution_count"] = [], None
    chinese.write_text(json.dumps(zh, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report differences, change nothing")
    args = parser.parse_args(argv)
    problems = []
    for english, chinese in pairs():
        if not chinese.exists():
            continue
        if args.check:
            problems += differences(english, chinese)
        elif not sync(english, chinese):
            problems.append(f"{chinese.name}: cells do not line up with {english.name}; add or remove the "
                            "matching markdown cell by hand first")
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
