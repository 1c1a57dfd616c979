"""Render every block of the given chapters' templates from every committed run fixture, in both
languages, one file per (run, chapter, language, block), so that two states of the templates can be
compared with ``diff -r``:

    python scripts/render_blocks.py OUT_DIR 01_operator_verification 02_ffn_fusion

Used before and after a change to a chapter's template or catalog: the English files must not
change (apart from fixes named in the commit), the Chinese ones change only where a sentence was
reworded on purpose.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from helpers import prose  # noqa: E402

RUNS = REPO / "tests" / "fixtures" / "runs"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out, chapters = Path(argv[0]), argv[1:]
    written = 0
    for chapter in chapters:
        for path in sorted(RUNS.glob(f"*/{chapter}/results.json")):
            results = json.loads(path.read_text(encoding="utf-8"))
            run = {p.parent.name: json.loads(p.read_text(encoding="utf-8"))
                   for p in path.parent.parent.glob("*/results.json")}
            for lang in prose.LANGUAGES:
                for block in prose.blocks(chapter, lang):
                    text = prose.render(chapter, block, results, run, lang=lang)
                    target = out / path.parent.parent.name / chapter / lang / f"{block}.md"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text + "\n", encoding="utf-8")
                    written += 1
    print(f"{written} blocks written under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
