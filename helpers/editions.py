"""The Chinese edition of the notebooks, generated from the English ones (layer: entry points; every
chapter, 00_environment_check to 08_report, and its worked answers).

    python -m helpers.editions           # write notebooks/zh/*.ipynb and solutions/zh/*.ipynb
    python -m helpers.editions --check   # only check that every one can be generated (exit 1 if not)

The code of a chapter is written once, in the English notebook. The Chinese notebook ``<folder>/zh/
<name>.ipynb`` is that notebook with each markdown cell replaced by its translation from the
chapter's gettext catalog (``helpers/locale/zh/LC_MESSAGES/<chapter>.po``, where its templates'
sentences are too), whose messages include the English markdown cells (msgid) and their Chinese
text (msgstr). Code cells, their tags, the cell ids and the notebook's metadata are the English
notebook's. Only the catalogs are committed: ``make setup`` and the runner (``--lang zh``) write the
notebooks. A markdown cell without a translation (new, changed, or marked fuzzy) stops the
generation and names the cell: after changing English markdown run ``python
scripts/update_catalogs.py <chapter>``, translate the cell in the ``.po`` (any PO editor; terms and
style in TERMINOLOGY.md) and run this again.

A generated notebook records a hash of its cells; one whose cells no longer match it was edited by
its reader (an exercise worked in JupyterLab) and is never overwritten: regenerating says so, and
deleting the file brings the generated one back.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

from . import REPO
from .catalogs import catalog_path

FOLDERS = ("notebooks", "solutions")
LANG = "zh"
STAMP = "workbook_generated"  # the notebook metadata key of the generated cells' hash


def pairs():
    """(English notebook, its chapter's catalog, the Chinese notebook) for every English notebook."""
    for folder in FOLDERS:
        for english in sorted((REPO / folder).glob("*.ipynb")):
            chapter = english.stem.removesuffix("_solutions")
            yield english, catalog_path(chapter, LANG), REPO / folder / LANG / english.name


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _text(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def read_catalog(path: Path):
    from babel.messages.pofile import read_po

    with path.open("rb") as handle:
        return read_po(handle, locale=LANG)


def dumps(notebook: dict) -> str:
    """A notebook as nbformat writes it (one-space indent, UTF-8 text)."""
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def cells_hash(notebook: dict) -> str:
    """What a reader's edit changes: each cell's kind and text (not outputs, not metadata)."""
    cells = [[c["cell_type"], _text(c)] for c in notebook["cells"]]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


class Untranslated(Exception):
    pass


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def translate(english: Path, catalog) -> dict:
    """The Chinese notebook: the English one with its markdown cells translated from ``catalog``."""
    notebook = copy.deepcopy(_load(english))
    missing = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        message = catalog.get(text := _text(cell))
        if message is None or not message.string or message.fuzzy:
            state = "missing" if message is None else "fuzzy" if message.fuzzy else "untranslated"
            first = text.strip().splitlines()[0][:70] if text.strip() else ""
            missing.append(f"cell {index} ({state}): {first!r}")
            continue
        cell["source"] = message.string.splitlines(keepends=True)
    if missing:
        raise Untranslated(f"{_name(english)}: {len(missing)} markdown cell(s) without a translation in the "
                           f"catalog (run python scripts/update_catalogs.py, then translate them): "
                           + "; ".join(missing))
    notebook["metadata"][STAMP] = cells_hash(notebook)
    return notebook


def write_notebook(english: Path, catalog_path: Path, chinese: Path) -> str:
    """Write the generated Chinese notebook unless its reader edited the one there; what was done:
    "written", "up to date" or "kept" (edited). Raises Untranslated / FileNotFoundError."""
    generated = translate(english, read_catalog(catalog_path))
    if chinese.exists():
        try:
            there = _load(chinese)
            stamp = there["metadata"].get(STAMP)
            edited = stamp != cells_hash(there)
        except (ValueError, KeyError, TypeError, AttributeError):
            edited = True
        if edited:
            return "kept"
        if stamp == generated["metadata"][STAMP]:
            return "up to date"  # the same cells; only its outputs or kernel choice may differ
    chinese.parent.mkdir(parents=True, exist_ok=True)
    partial = chinese.with_name(f".{chinese.name}.{os.getpid()}")  # two writers never leave half a file
    partial.write_text(dumps(generated), encoding="utf-8")
    os.replace(partial, chinese)
    return "written"


class Generated(NamedTuple):
    errors: list  # why a notebook could not be generated (an untranslated cell, a missing catalog)
    kept: list  # a notebook its reader edited, left as it is, and how to get the generated one


def generate() -> Generated:
    """Write every Chinese notebook that is missing or out of date; what is worth printing."""
    done = Generated([], [])
    for english, catalog_path, chinese in pairs():
        try:
            if write_notebook(english, catalog_path, chinese) == "kept":
                done.kept.append(f"{_name(chinese)} was edited since it was generated, or not generated here "
                                 f"(delete it to get the one {_name(english)} and its catalog make)")
        except (Untranslated, FileNotFoundError) as exc:
            done.errors.append(str(exc))
    return done


def problems(english: Path, catalog_path: Path) -> list[str]:
    """What keeps the Chinese notebook from being generated whole from its catalog ([] when none)."""
    if not catalog_path.exists():
        return [f"{_name(catalog_path)} does not exist"]
    try:
        translate(english, read_catalog(catalog_path))
    except Untranslated as exc:
        return [str(exc)]
    return []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.editions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="check that every notebook can be generated; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        done = Generated([p for english, catalog_path, _ in pairs() for p in problems(english, catalog_path)], [])
    else:
        done = generate()
    for label, lines in (("error", done.errors), ("kept", done.kept)):
        for line in lines:
            print(f"{label}: {line}", file=sys.stderr)
    return 1 if done.errors else 0


if __name__ == "__main__":
    sys.exit(main())
