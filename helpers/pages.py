"""Every HTML page the workbook writes, from Jinja2 templates with one layout and one stylesheet
(layer: foundations; taught in 08_report).

The runner's ``index.html`` (``helpers.run``), the report chapter's ``claims_report.html``
(``helpers.report``, taught in ``08_report.ipynb``) and the compare page (``helpers.compare``) are
``templates/<kind>.html.j2``, each extending ``base.html.j2`` with ``workbook.css`` inlined, so a page
stays a single file that can be mailed or archived; figures are PNG data URIs (``png_data_uri``).
Every visible word comes from ``templates/labels.en.yaml``, one table per page kind, in English; another
language reads each label through the runtime catalog (``helpers.catalogs``, context ``page``; a
counted word's forms under ``counted word``), so a page in Chinese is the same table translated the
way every other sentence is. The verdicts and verdict classes of ``helpers.claims`` are English keys;
their names and meanings are in the label file's ``common`` table, so a Chinese page
(``lang="zh"``, ``<html lang="zh-CN">``) names them in Chinese while the data keeps one vocabulary.
"""
from __future__ import annotations

import base64
import functools
import io
import math
import os
import time
from pathlib import Path
from typing import Optional

from .catalogs import LANGUAGES, SOURCE_LANGUAGE, runtime_translations
from .results import load_warning as _load_sentences

TEMPLATES = Path(__file__).resolve().parent / "templates"
KINDS = ("index", "claims", "compare")


PAGE, COUNTED = "page", "counted word"  # the catalog contexts of the labels (a unit word's forms apart)


def languages() -> list[str]:
    return list(LANGUAGES)


def label_strings() -> list:
    """``(context, English label)`` of every label of ``labels.en.yaml`` (what the runtime catalog
    translates; ``scripts/update_catalogs.py`` extracts them)."""
    found = []
    _each_label(_english(), lambda context, text: found.append((context, text)) or text)
    return found


@functools.lru_cache(maxsize=None)
def _english() -> dict:
    import yaml

    return yaml.safe_load((TEMPLATES / "labels.en.yaml").read_text(encoding="utf-8"))


def _each_label(table, say, counted: bool = False):
    """``table`` with ``say(context, text)`` in place of every label that is a message. A label
    without a letter (a sign, a "?") is the same in every language and not a message."""
    if isinstance(table, dict):
        return {key: _each_label(value, say, counted or key == "units") for key, value in table.items()}
    if isinstance(table, str) and any(c.isalpha() for c in table):
        return say(COUNTED if counted else PAGE, table)
    return table


@functools.lru_cache(maxsize=None)
def label_table(lang: str) -> dict:
    if lang not in LANGUAGES:
        raise ValueError(f"lang={lang!r}: the pages have labels in {', '.join(LANGUAGES)} "
                         "(add the language's runtime catalog to offer another)")
    return _english() if lang == SOURCE_LANGUAGE else _each_label(_english(), runtime_translations(lang).pgettext)


def labels(kind: str, lang: str = "en") -> dict:
    """The label table of one page kind (``index``, ``claims``, ``compare``) in ``lang``."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: choose one of {', '.join(KINDS)}")
    return label_table(lang)[kind]


def say(path: str, key, lang: str = "en") -> str:
    """The shown word for a key of the label table at a dotted path (``common.verdict_classes``,
    ``claims.evidence_kinds``); an unknown key as it is, an unknown table a KeyError."""
    table = label_table(lang)
    for part in path.split("."):
        if not isinstance(table, dict) or part not in table:
            raise KeyError(f"labels.en.yaml has no table {path!r}")
        table = table[part]
    return str(table.get(str(key), key))


def list_separator(lang: str = "en") -> str:
    """What joins the items of a list in ``lang`` (the catalog's "between items": ", " or "、")."""
    return runtime_translations(lang).pgettext("between items", ", ")


def load_warning(load: Optional[dict], lang: str = "en") -> str:
    """The warning a chapter's header and the index show beside figures taken under load ('' when
    none was): one sentence per reading of ``results.json``'s ``load`` above
    ``results.LOAD_PER_CORE_WARNING`` per core (``results.load_warning``), in ``lang``."""
    return _load_sentences(load, say("common", "load_warning", lang),
                           {w: say("common.load_when", w, lang) for w in ("start", "end")},
                           list_separator(lang))


HTML_LANG = {"zh": "zh-CN"}  # the simplified-Chinese glyphs of a CJK font, not the Japanese ones


def stylesheet() -> str:
    return (TEMPLATES / "workbook.css").read_text(encoding="utf-8")


def png_data_uri(fig, dpi: int = 90) -> str:
    """A matplotlib figure as a ``data:image/png`` URI (the figure is closed: it lives in the page now)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def cell_text(value) -> str:
    """A table cell: no 'nan' or 'None', floats at 4 significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def template_environment(lang: str = "en", *, autoescape: bool, folder: Path = TEMPLATES):
    """The one Jinja2 setup of the workbook's templates, the pages' and the chapters' sentences
    (``helpers.prose`` adds its figure filters): ``folder`` (``templates/``) as the loader, strict
    about missing names, block tags trimmed, and the ``label`` filter: a recorded key (a verdict
    class, a status) in ``lang``, the pages' word for it (``say``;
    ``{{ c.verdict_class | label("common.verdict_classes") }}``). A recorded figure is read as its
    text, which is the key ``say`` looks up."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), autoescape=autoescape,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["label"] = lambda key, table: say(table, str(key), lang)
    return env


@functools.lru_cache(maxsize=None)
def environment(lang: str = "en"):
    """The pages' environment: ``template_environment`` escaping what it is given, with the pages'
    filters (``fmt`` for labels holding markup, table cells, widths) and ``png`` for figures."""
    from markupsafe import Markup

    env = template_environment(lang, autoescape=True)
    # Labels are ours and may hold markup; the values put into them are escaped.
    env.filters["fmt"] = lambda label, **values: Markup(label).format(**values)
    env.filters["slug"] = lambda word: str(word).replace(" ", "-")
    env.filters["cell"] = cell_text
    env.filters["width"] = lambda column, widths: widths.get(column, 5)
    env.filters["breakable"] = lambda name: Markup("_<wbr>").join(str(name).split("_"))
    env.globals["png"] = png_data_uri
    return env


def render(kind: str, lang: str = "en", **context) -> str:
    """The page ``templates/<kind>.html.j2`` with its labels (``L``), the common ones (``C``), the list
    separator of ``lang`` (``sep``) and ``context``."""
    table = labels(kind, lang)
    return environment(lang).get_template(f"{kind}.html.j2").render(
        kind=kind, lang=lang, html_lang=HTML_LANG.get(lang, lang), L=table, C=label_table(lang)["common"],
        sep=list_separator(lang), css=stylesheet(), generated=time.strftime("%Y-%m-%d %H:%M:%S"), **context)


def write(path: "str | Path", kind: str, lang: str = "en", **context) -> Path:
    """Render and write atomically (readers never see half a page); the mode follows the umask."""
    path = Path(path)
    page = render(kind, lang, **context)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return path
