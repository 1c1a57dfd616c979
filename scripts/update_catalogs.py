"""Bring the gettext catalogs of the one-file chapter templates up to date with the templates:

    python scripts/update_catalogs.py            # every <chapter>.md.j2 of helpers/templates
    python scripts/update_catalogs.py 02_ffn_fusion

For each chapter this is `pybabel extract` (with babel.cfg, into a temporary .pot) and then
`pybabel update` of ``helpers/locale/<lang>/LC_MESSAGES/<chapter>.po`` for every translated language
(`pybabel init` when the catalog does not exist yet). A changed English sentence comes back as a
fuzzy entry with the old translation, a new one untranslated: translate them in the .po (any PO
editor works) and remove the fuzzy flags; tests/test_catalog.py fails until then. Nothing is
compiled: helpers.prose reads the .po itself.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from babel.messages.frontend import CommandLineInterface

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from helpers import prose  # noqa: E402

TRANSLATED = [lang for lang in prose.LANGUAGES if lang != prose.SOURCE_LANGUAGE]


def pybabel(*args: str) -> None:
    CommandLineInterface().run(["pybabel", "-q", *args])


def update(chapter: str) -> None:
    template = prose.TEMPLATES / f"{chapter}.md.j2"
    if not template.exists():
        raise SystemExit(f"{chapter}: no one-file template {template.relative_to(REPO)}; "
                         f"choose one of {', '.join(single_chapters())}")
    with tempfile.TemporaryDirectory() as tmp:
        pot = Path(tmp) / f"{chapter}.pot"
        pybabel("extract", "-F", str(REPO / "babel.cfg"), "--no-location", "--sort-output",
                "--project", "ascend-llama-workbook", "-o", str(pot), str(template.relative_to(REPO)))
        for lang in TRANSLATED:
            action = "update" if prose.catalog_path(chapter, lang).exists() else "init"
            pybabel(action, "-i", str(pot), "-d", str(prose.LOCALE), "-l", lang, "-D", chapter,
                    "--no-wrap", *(["--ignore-pot-creation-date"] if action == "update" else []))
            print(f"{action}: {prose.catalog_path(chapter, lang).relative_to(REPO)}")


def single_chapters() -> list[str]:
    return sorted(p.name[:-len(".md.j2")] for p in prose.TEMPLATES.glob("[0-9][0-9]_*.md.j2")
                  if p.name.count(".") == 2)


if __name__ == "__main__":
    import os

    os.chdir(REPO)  # babel.cfg's patterns are relative to the repository root
    for name in sys.argv[1:] or single_chapters():
        update(name)
