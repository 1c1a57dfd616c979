"""Bring the gettext catalogs up to date with what they translate:

    python scripts/update_catalogs.py            # every chapter, and runtime
    python scripts/update_catalogs.py 02_ffn_fusion
    python scripts/update_catalogs.py runtime    # what helpers and the worked answers say at run time

A chapter's catalog ``helpers/locale/<lang>/LC_MESSAGES/<chapter>.po`` holds what a reader of that
chapter reads in its language: the ``{% trans %}`` blocks of its page template and of its worked
answers' template (Babel's Jinja2 extractor with babel.cfg's options), then the markdown cells of its
notebook and of its worked answers' notebook, each cell one message (a cell is copied as written: its
``%`` is a ``%``, and one that looks like a placeholder is flagged ``no-python-format``; a template's
sentence writes a literal ``%`` as ``%%``). ``helpers.editions`` writes the Chinese notebooks from those cells.

The ``runtime`` catalog holds what the helpers say to a reader at run time (reasons, labels, a
table's words, the worked answers' paragraphs): the calls to ``prose.message`` /
``tell`` / ``N_`` / ``NC_`` / ``pgettext`` with a literal msgid in ``helpers/**.py`` and in the code
cells of the English notebooks and worked answers, read with Babel's Python extractor, the text
columns of the shipped data the tables show (``RUNTIME_DATA``), the sentences among the claims' rule
arguments (``helpers.claims.SAID_ARGS``) and the pages' labels (``helpers.pages.label_strings``).
It also holds every template sentence two chapters share (the list separator, "yes"): each is in
one catalog, and a chapter's lookups fall back to ``runtime``.

A changed English sentence comes back fuzzy with the old translation, a new one untranslated (one
that moved from another catalog keeps its translation): translate them in the .po (any PO editor
works; terms and style in TERMINOLOGY.md) and remove the fuzzy flags; tests/test_catalog.py and
tests/test_messages.py fail until then. Nothing is compiled: the helpers read the .po files.
"""
from __future__ import annotations

import collections
import configparser
import copy
import csv
import functools
import io
import json
import sys
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.extract import extract, extract_from_file
from babel.messages.pofile import read_po, write_po

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from helpers import catalogs, prose  # noqa: E402

TRANSLATED = [lang for lang in catalogs.LANGUAGES if lang != catalogs.SOURCE_LANGUAGE]
CELL = "no-python-format"  # a markdown cell that looks like a format string is none: its % is a %
HEADER = {"chapter": "# Chinese translation of chapter {name}: its templates' sentences (helpers/templates), then the\n"
                     "# markdown cells of its notebook and worked answers. Terms and style: TERMINOLOGY.md.\n"
                     "# Update with scripts/update_catalogs.py {name}.",
          "runtime": "# Chinese translation of what the helpers say at run time, the pages' labels and every\n"
                     "# message two chapters share. Terms and style: TERMINOLOGY.md.\n"
                     "# Update with scripts/update_catalogs.py runtime."}


def chapters() -> list[str]:
    return sorted(p.name[:-len(".md.j2")] for p in prose.TEMPLATES.glob("[0-9][0-9]_*.md.j2")
                  if p.name.count(".") == 2)


@functools.lru_cache(maxsize=None)
def _template_options() -> dict:
    config = configparser.ConfigParser()
    config.read(REPO / "babel.cfg", encoding="utf-8")
    return dict(config[next(s for s in config.sections() if s.startswith("jinja2:"))])


def template_messages(chapter: str) -> list[tuple]:
    """``(context, msgid)`` of the chapter's page template and its answers' template, in order."""
    found = []
    for path in (prose.TEMPLATES / f"{chapter}.md.j2", prose.TEMPLATES / prose.answer_template_name(chapter)):
        if path.exists():
            with open(path, "rb") as handle:
                for _, text, _, context in extract("jinja2", handle, options=_template_options()):
                    found.append((context, text if isinstance(text, str) else text[0]))
    return sorted(set(found), key=lambda key: (key[1], key[0] or ""))


def cell_messages(chapter: str) -> list[str]:
    """The markdown cells of the chapter's notebook and worked answers' notebook, in order."""
    cells = []
    for path in (REPO / "notebooks" / f"{chapter}.ipynb", REPO / "solutions" / f"{chapter}_solutions.ipynb"):
        if path.exists():
            cells += ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
                      if c["cell_type"] == "markdown"]
    return list(dict.fromkeys(cells))


def every_cell() -> set:
    """Every chapter's markdown cells (the messages of the chapters' catalogs that are not %-formatted)."""
    return {text for chapter in chapters() for text in cell_messages(chapter)}


def _add(catalog: Catalog, context, text: str, cell: bool) -> None:
    message = catalog.get(text, context) or catalog.add(text, None, context=context)
    if cell and "python-format" in message.flags:  # what xgettext does with a % that is no placeholder
        message.flags.discard("python-format")
        message.flags.add(CELL)


def _shared() -> list[tuple]:
    """``(context, msgid)`` of the template sentences two chapters share. A markdown cell stays its
    chapter's even where another notebook has the same English: its translation may differ (the
    parameter cell's table of the chapter's own parameters)."""
    found = collections.Counter(key for chapter in chapters() for key in template_messages(chapter))
    return [key for key, count in found.items() if count > 1]


def chapter_messages(chapter: str) -> Catalog:
    """The messages of the chapter's catalog: its own, less those of the runtime catalog."""
    runtime = runtime_messages()
    catalog = Catalog(fuzzy=False)
    for context, text in template_messages(chapter):
        if runtime.get(text, context) is None:
            _add(catalog, context, text, False)
    for text in cell_messages(chapter):
        _add(catalog, None, text, True)
    return catalog


def update(domain: str, messages: Catalog, known: dict) -> None:
    """Merge ``messages`` into the domain's catalog of each translated language: new ones from
    ``known`` (what every catalog translates today) where a catalog has them, else untranslated,
    changed ones fuzzy with the old translation (Babel's update), gone ones dropped."""
    for lang in TRANSLATED:
        path = catalogs.catalog_path(domain, lang)
        if path.exists():
            with path.open("rb") as handle:
                catalog = read_po(handle, locale=lang)
        else:
            catalog = Catalog(locale=lang, project="ascend-llama-workbook", version="0.1.0", fuzzy=False,
                              last_translator="ascend-llama-workbook contributors", language_team=f"Chinese ({lang})")
        catalog.update(messages, no_fuzzy_matching=False, update_creation_date=False)
        catalog.obsolete.clear()
        for message in catalog:
            if CELL in message.flags:  # Babel's reader flags a cell with "% o" in it python-format again
                message.flags.discard("python-format")
            if message.id and (not message.string or message.fuzzy) and known.get((lang, message.context, message.id)):
                message.string = known[(lang, message.context, message.id)]
                message.flags.discard("fuzzy")
        catalog.header_comment = HEADER["runtime" if domain == catalogs.RUNTIME_DOMAIN else "chapter"].format(name=domain)
        buffer = io.BytesIO()
        write_po(buffer, catalog, width=0, no_location=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(buffer.getvalue())
        todo = sum(1 for m in catalog if m.id and (not m.string or m.fuzzy))
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"updated: {shown}" + (f" ({todo} to translate)" if todo else ""))


def translations_today(paths) -> dict:
    """``{(lang, context, msgid): translation}`` of the given catalogs (not fuzzy, not empty)."""
    known = {}
    for path in paths:
        lang = path.parent.parent.name  # locale/<lang>/LC_MESSAGES/<domain>.po
        with path.open("rb") as handle:
            for m in read_po(handle):
                if m.id and m.string and not m.fuzzy:
                    known[(lang, m.context, m.id if isinstance(m.id, str) else m.id[0])] = m.string
    return known


# the calls whose literal msgid is a run-time message (Babel keyword specs: "1c" is the context)
RUNTIME_KEYWORDS = {"message": (1,), "tell": (2,), "N_": (1,),
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


@functools.lru_cache(maxsize=None)
def runtime_messages() -> Catalog:
    """Every run-time message of the sources (``runtime_sources``) and every message two chapters
    share, as a template catalog."""
    found = []  # (msgid, context, cell)
    for path in runtime_sources():
        if path.suffix == ".py":
            messages = extract_from_file("python", str(path), keywords=RUNTIME_KEYWORDS)
        else:
            messages = extract("python", io.BytesIO(_notebook_code(path).encode("utf-8")), keywords=RUNTIME_KEYWORDS)
        found += [(text, context, False) for _, text, _, context in messages]
    from helpers.claims import SAID_ARGS, parse_args

    with open(REPO / "data" / "guide_claims.csv", newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):  # the sentences of the claims' rules
            found += [(value, None, False) for key, value in parse_args(row.get("args") or "").items()
                      if key in SAID_ARGS and value.strip()]
    from helpers.pages import label_strings

    found += [(text, context, False) for context, text in label_strings()]  # the pages' labels
    for name, columns in RUNTIME_DATA.items():
        with open(REPO / name, newline="", encoding="utf-8") as handle:
            found += [(row[column], None, False) for row in csv.DictReader(handle) for column in columns
                      if (row.get(column) or "").strip()]
    found += [(text, context, False) for context, text in _shared()]
    catalog = Catalog(fuzzy=False)
    for text, context, cell in sorted(set(found), key=lambda m: (m[0], m[1] or "")):
        _add(catalog, context, text, cell)
    return catalog


def main(names: list[str]) -> None:
    every = [*chapters(), catalogs.RUNTIME_DOMAIN]
    unknown = sorted(set(names) - set(every))
    if unknown:
        raise SystemExit(f"{', '.join(unknown)}: no such catalog; choose among {', '.join(every)}")
    known = translations_today(sorted(catalogs.LOCALE.glob("*/LC_MESSAGES/*.po")))
    for name in names or every:
        messages = runtime_messages() if name == catalogs.RUNTIME_DOMAIN else chapter_messages(name)
        update(name, copy.deepcopy(messages), known)


if __name__ == "__main__":
    main(sys.argv[1:])
