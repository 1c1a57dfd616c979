"""The gettext catalogs every reader-facing word is translated through (layer: foundations; taught
in 08_report, whose pages a Chinese reader reads in Chinese).

One mechanism: ``locale/<lang>/LC_MESSAGES/<domain>.po``. A chapter has its own domain
(``<chapter>.po``: its templates' ``{% trans %}`` blocks and its notebooks' markdown cells); everything
else a reader sees is in the ``runtime`` domain: what the helpers and the worked answers say at run
time, each decision's phrase (context ``decision``), the pages' labels (``pages.LABELS``: the same
message as the same word in a table) and the sentences two chapters' templates share.
``scripts/update_catalogs.py`` extracts them; a .po is read as it is committed.
"""
from __future__ import annotations

import functools
import gettext
import io
from pathlib import Path

LANGUAGES = ("en", "zh")
SOURCE_LANGUAGE = "en"  # the templates, helpers and labels are written in English; the catalogs translate
LOCALE = Path(__file__).resolve().parent / "locale"
RUNTIME_DOMAIN = "runtime"


def catalog_path(chapter: str, lang: str) -> Path:
    """The gettext catalog (``.po``) that translates a chapter (or ``runtime``) into ``lang``."""
    return LOCALE / lang / "LC_MESSAGES" / f"{chapter}.po"


@functools.lru_cache(maxsize=None)
def read_catalog(path: Path, stamp: float) -> gettext.GNUTranslations:
    # The .po is read as it is committed (no compiled .mo to keep in step): Babel parses it and writes
    # the .mo in memory, without fuzzy entries, exactly as `pybabel compile` would. Only the
    # translated editions need Babel, so it is imported here.
    from babel.messages import mofile, pofile

    with open(path, "rb") as handle:
        catalog = pofile.read_po(handle, domain=path.stem)
    compiled = io.BytesIO()
    mofile.write_mo(compiled, catalog)
    compiled.seek(0)
    return gettext.GNUTranslations(compiled)


def runtime_translations(lang: str) -> gettext.NullTranslations:
    """The ``runtime`` catalog of ``lang`` (English is the msgids themselves). A language without
    one is an error, never a silent English page."""
    if lang == SOURCE_LANGUAGE:
        return gettext.NullTranslations()
    if lang not in LANGUAGES:
        raise ValueError(f"lang={lang!r} is not valid; choose one of {', '.join(LANGUAGES)}")
    path = catalog_path(RUNTIME_DOMAIN, lang)
    if not path.exists():
        raise FileNotFoundError(f"no {lang} catalog of the helpers' run-time messages: write "
                                f"{path.relative_to(LOCALE.parent)} (scripts/update_catalogs.py {RUNTIME_DOMAIN})")
    return read_catalog(path, path.stat().st_mtime)


def edition_language(lang: str = "auto") -> str:
    """``en`` or ``zh``: ``auto`` is the edition the notebook belongs to. A kernel runs in its
    notebook's folder (JupyterLab and the runner both start it there), and the Chinese edition is
    ``notebooks/zh`` / ``solutions/zh``, so the folder's name says which edition this is."""
    return ("zh" if Path.cwd().name == "zh" else "en") if lang == "auto" else lang
