"""Bring the gettext catalogs of the one-file chapter templates up to date with the templates:

    python scripts/update_catalogs.py            # every <chapter>.md.j2 of helpers/templates, and runtime
    python scripts/update_catalogs.py 02_ffn_fusion
    python scripts/update_catalogs.py runtime    # what helpers and the worked answers say at run time

For each chapter this is `pybabel extract` (with babel.cfg, into a temporary .pot) and then
`pybabel update` of ``helpers/locale/<lang>/LC_MESSAGES/<chapter>.po`` for every translated language
(`pybabel init` when the catalog does not exist yet). A changed English sentence comes back as a
fuzzy entry with the old translation, a new one untranslated: translate them in the .po (any PO
editor works) and remove the fuzzy flags; tests/test_catalog.py fails until then. Nothing is
compiled: helpers.prose reads the .po itself.

The ``runtime`` domain holds what the helpers say to a reader at run time (reasons, labels, a
table's words, the worked answers' paragraphs): the calls to ``prose.message`` / ``pmessage`` /
``tell`` / ``N_`` / ``NC_`` / ``pgettext`` with a literal msgid in ``helpers/**.py`` and in the code cells of
the English notebooks and worked answers (the Chinese ones have the same code), read with Babel's
Python extractor, the text columns of the shipped data the tables show (``RUNTIME_DATA``), the
sentences among the claims' rule arguments (``helpers.claims.SAID_ARGS``) and the pages' labels
(``helpers.pages.LABELS``, ``helpers.pages.label_strings``), in
``runtime_messages``; tests/test_messages.py extracts the same way.
"""
from __future__ import annotations

import csv
import sys
import tempfile
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.extract import extract, extract_from_file
from babel.messages.frontend import CommandLineInterface
from babel.messages.pofile import write_po

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from helpers import catalogs, prose  # noqa: E402

TRANSLATED = [lang for lang in catalogs.LANGUAGES if lang != catalogs.SOURCE_LANGUAGE]


def pybabel(*args: str) -> None:
    CommandLineInterface().run(["pybabel", "-q", *args])


def update(chapter: str) -> None:
    template = prose.TEMPLATES / f"{chapter}.md.j2"
    if not template.exists():
        raise SystemExit(f"{chapter}: no one-file template {template.relative_to(REPO)}; "
                         f"choose one of {', '.join(single_chapters())}")
    with tempfile.TemporaryDirectory() as tmp:
        pot = Path(tmp) / f"{chapter}.pot"
        # the chapter's worked answers, where they have a template, share its catalog
        answers = prose.TEMPLATES / prose.answer_template_name(chapter)
        sources = [template, answers] if answers.exists() else [template]
        pybabel("extract", "-F", str(REPO / "babel.cfg"), "--no-location", "--sort-output",
                "--project", "ascend-llama-workbook", "-o", str(pot), *(str(p.relative_to(REPO)) for p in sources))
        for lang in TRANSLATED:
            action = "update" if catalogs.catalog_path(chapter, lang).exists() else "init"
            pybabel(action, "-i", str(pot), "-d", str(catalogs.LOCALE), "-l", lang, "-D", chapter,
                    "--no-wrap", *(["--ignore-pot-creation-date"] if action == "update" else []))
            print(f"{action}: {catalogs.catalog_path(chapter, lang).relative_to(REPO)}")


# the calls whose literal msgid is a run-time message (Babel keyword specs: "1c" is the context)
RUNTIME_KEYWORDS = {"message": (1,), "pmessage": ((1, "c"), 2), "tell": (2,), "N_": (1,),
                    "NC_": ((1, "c"), 2), "pgettext": ((1, "c"), 2)}


def _notebook_code(path: Path) -> str:
    import json

    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


# Text columns of the shipped data that the chapters' tables show (each distinct cell is a message)
RUNTIME_DATA = {"data/device_specs.csv": ("source", "note")}


def runtime_sources() -> list[Path]:
    return (sorted((REPO / "helpers").rglob("*.py")) + sorted((REPO / "notebooks").glob("*.ipynb"))
            + sorted((REPO / "solutions").glob("*.ipynb")))


def runtime_messages() -> Catalog:
    """Every run-time message of the sources (``runtime_sources``), as a template catalog."""
    import io

    catalog = Catalog(project="ascend-llama-workbook", fuzzy=False)
    for path in runtime_sources():
        if path.suffix == ".py":
            found = extract_from_file("python", str(path), keywords=RUNTIME_KEYWORDS, strip_comment_tags=True)
        else:
            found = extract("python", io.BytesIO(_notebook_code(path).encode("utf-8")), keywords=RUNTIME_KEYWORDS)
        for lineno, text, comments, context in found:
            catalog.add(text, None, [(str(path.relative_to(REPO)), lineno)], auto_comments=comments,
                        context=context)
    from helpers.claims import SAID_ARGS, parse_args

    with open(REPO / "data" / "guide_claims.csv", newline="", encoding="utf-8") as handle:
        for lineno, row in enumerate(csv.DictReader(handle), start=2):  # the sentences of the claims' rules
            for key, value in parse_args(row.get("args") or "").items():
                if key in SAID_ARGS and value.strip():
                    catalog.add(value, None, [("data/guide_claims.csv", lineno)])
    from helpers.pages import label_strings

    for context, text in label_strings():  # the pages' labels, in the English label table
        catalog.add(text, None, [("helpers/pages.py", 0)], context=context)
    for name, columns in RUNTIME_DATA.items():
        with open(REPO / name, newline="", encoding="utf-8") as handle:
            for lineno, row in enumerate(csv.DictReader(handle), start=2):
                for column in columns:
                    if (row.get(column) or "").strip():
                        catalog.add(row[column], None, [(name, lineno)])
    return catalog


def update_runtime() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pot = Path(tmp) / f"{catalogs.RUNTIME_DOMAIN}.pot"
        with open(pot, "wb") as handle:
            write_po(handle, runtime_messages(), no_location=True, sort_output=True, width=0)
        for lang in TRANSLATED:
            path = catalogs.catalog_path(catalogs.RUNTIME_DOMAIN, lang)
            action = "update" if path.exists() else "init"
            # a message no longer in the code is dropped (not kept as obsolete): tests/test_messages.py
            pybabel(action, "-i", str(pot), "-d", str(catalogs.LOCALE), "-l", lang, "-D", catalogs.RUNTIME_DOMAIN,
                    "--no-wrap", *(["--ignore-pot-creation-date", "--ignore-obsolete"] if action == "update" else []))
            print(f"{action}: {path.relative_to(REPO)}")


def single_chapters() -> list[str]:
    return sorted(p.name[:-len(".md.j2")] for p in prose.TEMPLATES.glob("[0-9][0-9]_*.md.j2")
                  if p.name.count(".") == 2)


if __name__ == "__main__":
    import os

    os.chdir(REPO)  # babel.cfg's patterns are relative to the repository root
    for name in sys.argv[1:] or [*single_chapters(), catalogs.RUNTIME_DOMAIN]:
        update_runtime() if name == catalogs.RUNTIME_DOMAIN else update(name)
