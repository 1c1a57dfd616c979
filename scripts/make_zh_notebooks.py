"""Generate the Chinese edition of the notebooks from the English ones and one catalog per notebook.

    python scripts/make_zh_notebooks.py           # write notebooks/zh/*.ipynb and solutions/zh/*.ipynb
    python scripts/make_zh_notebooks.py --check   # only compare them with what is committed (exit 1)
    python scripts/make_zh_notebooks.py --update  # after changing English markdown: put the new cells
                                                  # into the catalogs (untranslated; old ones fuzzy)

The code of a chapter is written once, in the English notebook. The Chinese notebook ``<folder>/zh/
<name>.ipynb`` is that notebook with each markdown cell replaced by its translation from the gettext
catalog ``<folder>/zh/<name>.po``, whose messages are the English markdown cells (msgid) and their
Chinese text (msgstr). Code cells, their tags, the cell ids and the notebook's metadata are the
English notebook's. A markdown cell without a translation (new, changed, or marked fuzzy) stops the
generation and names the cell: translate it in the ``.po`` (any PO editor; terms and style in
TERMINOLOGY.md) and run this again. ``tests/test_editions.py`` runs ``--check``.
"""
from __future__ import annotations

import argparse
import copy
import io
import json
import sys
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("notebooks", "solutions")
LANG = "zh"


def pairs(repo: Path = REPO):
    """(English notebook, its catalog, the Chinese notebook) for every English notebook."""
    for folder in FOLDERS:
        for english in sorted((repo / folder).glob("*.ipynb")):
            zh = repo / folder / LANG
            yield english, zh / f"{english.stem}.po", zh / english.name


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _text(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def markdown_messages(notebook: dict) -> list[str]:
    """The notebook's markdown cells, each once, in order: the messages of its catalog."""
    return list(dict.fromkeys(_text(c) for c in notebook["cells"] if c["cell_type"] == "markdown"))


def read_catalog(path: Path) -> Catalog:
    with path.open("rb") as handle:
        return read_po(handle, locale=LANG)


def dumps(notebook: dict) -> str:
    """A notebook as the repository keeps it (nbformat's layout: one-space indent, UTF-8 text)."""
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


class Untranslated(Exception):
    pass


def translate(english: Path, catalog: Catalog) -> dict:
    """The Chinese notebook: the English one with its markdown cells translated from ``catalog``."""
    notebook = copy.deepcopy(_load(english))
    missing = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        message = catalog.get(_text(cell))
        if message is None or not message.string or message.fuzzy:
            state = "missing" if message is None else "fuzzy" if message.fuzzy else "untranslated"
            first = _text(cell).strip().splitlines()[0][:70] if _text(cell).strip() else ""
            missing.append(f"cell {index} ({state}): {first!r}")
            continue
        cell["source"] = message.string.splitlines(keepends=True)
    if missing:
        raise Untranslated(f"{english.relative_to(REPO) if english.is_relative_to(REPO) else english}: "
                           f"{len(missing)} markdown cell(s) without a translation in the catalog "
                           f"(run with --update, then translate them): " + "; ".join(missing))
    return notebook


def obsolete(english: Path, catalog: Catalog) -> list[str]:
    """Catalog messages that are no markdown cell of the English notebook any more."""
    wanted = set(markdown_messages(_load(english)))
    return [m.id for m in catalog if m.id and m.id not in wanted]


def update(english: Path, catalog_path: Path) -> int:
    """Put the English notebook's markdown cells into its catalog: new ones untranslated, changed ones
    fuzzy with the old translation as a start (Babel's update), gone ones dropped. Returns how many
    messages need a translator."""
    template = Catalog(locale=LANG, project="ascend-llama-workbook")
    for text in markdown_messages(_load(english)):
        template.add(text)
    name = f"{english.parent.name}/{english.name}"
    catalog = read_catalog(catalog_path) if catalog_path.exists() else new_catalog(name)
    catalog.update(template, no_fuzzy_matching=False)
    catalog.obsolete.clear()
    write(catalog, catalog_path)
    return sum(1 for m in catalog if m.id and (not m.string or m.fuzzy))


def new_catalog(english_name: str) -> Catalog:
    catalog = Catalog(locale=LANG, project="ascend-llama-workbook", version="0.1.0", fuzzy=False,
                      last_translator="ascend-llama-workbook contributors", language_team="Chinese (zh)")
    catalog.header_comment = (f"# The Chinese edition of {english_name}: its markdown cells (msgid) and their\n"
                              "# translations (msgstr). Terms and style: TERMINOLOGY.md. After changing the English\n"
                              "# notebook: python scripts/make_zh_notebooks.py --update, translate, then run it again.")
    return catalog


def write(catalog: Catalog, path: Path) -> None:
    buffer = io.BytesIO()
    write_po(buffer, catalog, width=0, omit_header=False, no_location=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())


def problems(english: Path, catalog_path: Path, chinese: Path) -> list[str]:
    """What keeps the committed Chinese notebook from being the generated one ([] when in step)."""
    if not catalog_path.exists():
        return [f"{catalog_path.relative_to(REPO)} does not exist"]
    catalog = read_catalog(catalog_path)
    found = [f"{catalog_path.name}: a message no markdown cell of {english.name} has any more "
             f"(run with --update): {text.strip().splitlines()[0][:70]!r}" for text in obsolete(english, catalog)]
    try:
        expected = dumps(translate(english, catalog))
    except Untranslated as exc:
        return found + [str(exc)]
    if not chinese.exists() or chinese.read_text(encoding="utf-8") != expected:
        found.append(f"{chinese.relative_to(REPO)} is not what {english.relative_to(REPO)} and "
                     f"{catalog_path.name} generate: run python scripts/make_zh_notebooks.py")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare with the committed notebooks, change nothing")
    mode.add_argument("--update", action="store_true", help="put new or changed English markdown into the catalogs")
    args = parser.parse_args(argv)
    found = []
    for english, catalog_path, chinese in pairs():
        if args.update:
            todo = update(english, catalog_path)
            if todo:
                print(f"{catalog_path.relative_to(REPO)}: {todo} message(s) to translate")
        elif args.check:
            found += problems(english, catalog_path, chinese)
        else:
            try:
                chinese.write_text(dumps(translate(english, read_catalog(catalog_path))), encoding="utf-8")
            except (Untranslated, FileNotFoundError) as exc:
                found.append(str(exc))
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
