"""Sentences from recorded results: every data-driven paragraph of a chapter is a Jinja2 template
(layer: foundations; taught in every chapter from 00_environment_check on).

Each chapter's summary cell is ``chapter.summary()``; the templates live in
``helpers/templates/<chapter>.md.j2``, one template for every language: English ``{% trans %}``
messages translated by the gettext catalog ``helpers/locale/<lang>/LC_MESSAGES/<chapter>.po``; one
``{% block %}`` per paragraph. A template sees
only what the chapter recorded (``results.json``: figures ``m``, tables ``t``, parameters ``p``, the
environment ``env``, and other chapters of the run as ``run``), never the notebook's variables, so
the same text renders from a fixture of any device in the tests.

Three rules make a rendered sentence hold on every device, and ``tests/test_prose.py`` checks them
over recorded runs of a float32 CPU, a bf16 CPU, an NPU and a CUDA GPU:

* **Numbers are recorded figures.** Every value in the context is a ``Fig`` that remembers where it
  came from; the ``num`` / ``fig`` filters format one. A template cannot compute a number (a
  ``Fig`` refuses arithmetic); a derived figure is recorded by the chapter or computed by a named,
  tested function here.
* **Direction words come from decisions.** "faster", "slower", "best", "same effect", "at the
  bandwidth", "grows" are never literal template text: they are what ``helpers.decide`` returns for
  the spreads it is given (``direction``, ``rank``, ``met``, ``effect``, ...).
* **Dtype words come from the run.** No template spells a dtype; ``{{ dtype }}`` and the recorded
  figures' own ``dtype`` fields do.
"""
from __future__ import annotations

import copy
import functools
import gettext
import math
import operator
import re
from pathlib import Path
from typing import Any, Optional

from . import decide, pages
from .catalogs import (LANGUAGES, LOCALE, RUNTIME_DOMAIN, SOURCE_LANGUAGE, catalog_path, read_catalog,
                       runtime_translations)

TEMPLATES = pages.TEMPLATES  # one folder for the pages' templates and the chapters'
AUDIT_OPEN, AUDIT_CLOSE = "\u27e6", "\u27e7"  # ⟦source=text⟧ around each figure in audit mode


def _compare(op):
    """A comparison of a ``Fig``'s value with another ``Fig``'s or with a plain value."""
    def compare(self, other):
        return op(self.value, other.value if isinstance(other, Fig) else other)
    return compare


class Fig:
    """A recorded value and where it came from (``03_end_to_end.ttft_ms``, ``decode_gap[0].step_ms``).

    Comparisons work (templates choose between sentences on recorded facts); arithmetic does not.
    """

    __slots__ = ("value", "source", "unit", "samples")

    def __init__(self, value: Any, source: str, unit: str = "", samples: Optional[float] = decide.EXACT):
        self.value, self.source, self.unit = value, source, unit or ""
        # how many samples the figure stands on (decide.samples_of of its record): the decide
        # functions a template calls get it, so no direction is said from too few
        self.samples = samples

    __eq__, __lt__, __le__ = _compare(operator.eq), _compare(operator.lt), _compare(operator.le)
    __gt__, __ge__ = _compare(operator.gt), _compare(operator.ge)

    def __hash__(self):
        return hash((self.source, repr(self.value)))

    def __bool__(self):
        return bool(self.value) and not (isinstance(self.value, float) and math.isnan(self.value))

    def __str__(self):
        return str(self.value)

    def __repr__(self):
        return f"Fig({self.value!r}, {self.source!r})"

    def _no_arithmetic(self, *_):
        raise TypeError(f"templates do not compute numbers: record {self.source}'s derived figure in the "
                        "chapter, or add a named function to helpers.prose / helpers.decide")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_arithmetic
    __truediv__ = __rtruediv__ = __floordiv__ = __mod__ = __pow__ = __neg__ = _no_arithmetic


class Record(dict):
    """A recorded entry or table row: keys read as attributes, values wrapped as ``Fig``."""

    def __init__(self, data: dict, source: str, unit: str = "", samples: Optional[float] = None):
        super().__init__()
        count = decide.samples_of(data or {}, samples)
        for key, value in (data or {}).items():
            if isinstance(key, str) and isinstance(data.get(key + MESSAGE_SUFFIX), dict):
                value = Message.from_record(data[key + MESSAGE_SUFFIX], value)  # said in the page's language
            self[key] = _wrap(value, f"{source}.{key}", unit if key == "value" else "", count)

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _wrap(value: Any, source: str, unit: str = "", samples: Optional[float] = None):
    if isinstance(value, dict):
        return Record(value, source, value["unit"] if isinstance(value.get("unit"), str) else "", samples)
    if isinstance(value, list):
        return [_wrap(v, f"{source}[{i}]", "", samples) for i, v in enumerate(value)]
    return Fig(value, source, unit, samples)


def context_of(results: dict, run: Optional[dict] = None) -> dict:
    """The template context for one chapter's ``results.json`` (and, optionally, its run's others)."""
    chapter = results.get("chapter", "chapter")
    count = decide.chapter_samples(results.get("parameters"))
    metrics = {key: Record(entry, f"{chapter}.{key}", entry.get("unit", ""), count)
               for key, entry in (results.get("metrics") or {}).items()}
    tables = {name: _wrap(recorded_rows(results, name), f"{chapter}.{name}", "", count)
              for name in (results.get("tables") or {})}
    return {"m": metrics, "t": tables, "p": Record(results.get("parameters") or {}, f"{chapter}.parameters"),
            "env": Record(results.get("environment") or {}, f"{chapter}.environment"),
            "chapter": chapter, "run": _Run({name: data for name, data in (run or {}).items() if name != chapter})}


class _Run(dict):
    """The run's other chapters for a template (``run["03_end_to_end"].m...``): each chapter's record is
    wrapped as a context when a template first reads it, not for every paragraph rendered."""

    def __init__(self, records: dict):
        super().__init__(records)
        self._contexts = {}

    def __getitem__(self, name):
        if name not in self._contexts:
            self._contexts[name] = context_of(super().__getitem__(name))
        return self._contexts[name]

    def get(self, name, default=None):
        return self[name] if name in self else default


# --- formatting ------------------------------------------------------------------------------------

def _figure(value: Any) -> Any:
    """A figure's ``Record`` stands for its ``value``; anything else for itself."""
    return value.value if isinstance(value, Record) and "value" in value else value


def _plain(value: Any) -> Any:
    """The recorded value behind a ``Fig`` or a figure's ``Record`` (its ``value``)."""
    if isinstance(value, Record):
        value = value.get("value")
    return value.value if isinstance(value, Fig) else value


def format_number(value: Any, digits: int = 3) -> str:
    """A figure at the precision a measurement supports: ``digits`` significant digits."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "–"}[value]
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        magnitude = abs(value)
        if magnitude >= 10 ** digits:
            return f"{value:,.0f}"
        if magnitude == 0:
            return "0"
        decimals = max(digits - 1 - int(math.floor(math.log10(magnitude))), 0)
        return f"{value:.{decimals}f}"
    return str(value)


UNIT_JOIN = {"x": "x", "%": " %", "": ""}
# A recorded unit as a language writes it (TERMINOLOGY.md: tokens per second are tokens/s in Chinese,
# never tok/s); a unit not listed is written as recorded.
UNIT_NAMES = {"zh": {"tok/s": "tokens/s"}}


class Renderer:
    """Formats ``Fig`` values, their units as ``lang`` writes them; in audit mode each one is wrapped
    as ``⟦source=text⟧`` for the tests."""

    def __init__(self, audit: bool = False, lang: str = SOURCE_LANGUAGE):
        self.audit, self.units = audit, UNIT_NAMES.get(lang, {})

    def mark(self, fig: Any, text: str) -> str:
        if self.audit and isinstance(fig, Fig):
            return f"{AUDIT_OPEN}{fig.source}={text}{AUDIT_CLOSE}"
        return text

    def num(self, fig: Any, digits: int = 3) -> str:
        """The value alone: ``{{ m.ttft_ms | num }}`` -> ``12.3``."""
        fig = _figure(fig)
        return self.mark(fig, format_number(_plain(fig), digits))

    def fig(self, entry: Any, digits: int = 3) -> str:
        """A recorded figure with its unit: ``{{ m.ttft_ms | fig }}`` -> ``12.3 ms``."""
        value = _figure(entry)
        unit = value.unit if isinstance(value, Fig) else ""
        unit = self.units.get(unit, unit)
        return self.mark(value, format_number(_plain(value), digits) + UNIT_JOIN.get(unit, f" {unit}"))

    def size(self, value: Any) -> str:
        """A byte count in decimal units (``269 MB``): a change of unit, the figure is the same."""
        v = _plain(value)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return self.mark(value, str(v))
        unit, scale = next((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3), ("bytes", 1))
                           if abs(v) >= s or s == 1)
        return self.mark(value, f"{format_number(v / scale if scale > 1 else int(v))} {unit}")

    def count(self, rows: Any) -> str:
        """How many rows a recorded table (or a selection of it) has: a count, not a computation."""
        rows = list(rows)
        return self.mark(Fig(len(rows), "count"), format_number(len(rows)))

    def unit(self, value: Any) -> str:
        """A recorded unit on its own (``{{ claim.unit | unit }}``), as the page's language writes it."""
        unit = str(_plain(value))
        return self.units.get(unit, unit)

    def text(self, value: Any) -> str:
        """A recorded word (a dtype, a device, a kernel name) as it was recorded."""
        return self.mark(value, str(_plain(value)))


def pct(part: Any, whole: Any) -> Fig:
    """``part`` as a percentage of ``whole``: the one derived number a template may state, named by
    both sources (``100 * a / b``)."""
    a, b = _plain(part), _plain(whole)
    value = 100.0 * a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else math.nan
    return Fig(value, f"100*{getattr(part, 'source', a)}/{getattr(whole, 'source', b)}", "%")


def other_dtype(dtype: Any, device: Any) -> str:
    """The dtype an exercise compares with: float32 for a 16-bit run; for a float32 run the 16-bit
    dtype of the device (bfloat16 on a CPU, float16 on NPU / CUDA)."""
    if str(_plain(dtype)) != "float32":
        return "float32"
    return "bfloat16" if str(_plain(device)).startswith("cpu") else "float16"


def NC_(context: str, msgid: str) -> str:
    """Marks a word with a gettext context for the runtime catalog (extracted like ``pgettext``).
    Returns it unchanged."""
    return msgid


# What each helpers.decide decision says in a sentence (templates: ``{{ decision | say }}``), in
# English; the runtime catalog translates each phrase under the context "decision". Templates never
# spell these words themselves, so a direction always comes from a decision.
PHRASES = {
    "faster": NC_("decision", "faster beyond the noise"),
    "slower": NC_("decision", "slower beyond the noise"),
    "no difference beyond the noise": NC_("decision", "no difference beyond the noise"),
    "met": NC_("decision", "met"),
    "not met": NC_("decision", "not met"),
    "within the noise of the goal": NC_("decision", "within the noise of the goal"),
    "same effect": NC_("decision", "the same effect (same direction, size within 2x of the claim)"),
    "smaller effect": NC_("decision", "the same direction but a smaller effect (less than half the claimed size)"),
    "larger effect": NC_("decision", "the same direction but a larger effect (more than twice the claimed size)"),
    "opposite effect": NC_("decision", "the opposite effect"),
    "no effect beyond the noise": NC_("decision", "no effect beyond the noise"),
    "no effect claimed": NC_("decision", "no effect claimed"),
    "at the bandwidth": NC_("decision", "at the bandwidth (bound by moving bytes)"),
    "below the bandwidth": NC_("decision", "below the bandwidth (its time goes to something other than moving "
                                           "bytes)"),
    "above the bandwidth": NC_("decision", "above the DRAM bandwidth (the data stayed in the caches)"),
    "grows": NC_("decision", "grows beyond the noise"),
    "shrinks": NC_("decision", "shrinks beyond the noise"),
    "no change beyond the noise": NC_("decision", "no change beyond the noise"),
    "not measured": NC_("decision", "not measured"),
    "least time, clear": NC_("decision", "took the least time, apart from the others beyond the noise"),
    "least time, tied": NC_("decision", "took the least time within each other's noise"),
    "most, clear": NC_("decision", "is ahead of the others beyond the noise"),
    "most, tied": NC_("decision", "are ahead within each other's noise"),
    # helpers.decide.too_few: a comparison from fewer samples than decide.MIN_SAMPLES (or a percentile
    # from fewer than decide.percentile_samples) says no direction; {n} and {need} are the counts
    "too few samples": NC_("decision", "too few samples to say a direction ({n} of the {need} needed)"),
    "too few samples, not recorded": NC_("decision", "too few samples to say a direction (the sample count was not "
                                                     "recorded; {need} are needed)"),
    # chapter 07: why there is no users-served ratio (helpers.serving.users_ratio)
    "users ratio: baseline serves none": NC_("decision", "our path serves no user within the targets at chapter "
                                                         "04's lengths, so there is nothing to divide by"),
    "users ratio: lower bound": NC_("decision", "a sweep ended while its largest level still met both targets, so "
                                                "its count is only a lower bound"),
    "users ratio: not both measured": NC_("decision", "vLLM and our path were not both measured at chapter 04's "
                                                      "batch sizes and lengths"),
    # chapter 05: a speedup against the most its cut in bytes allows (helpers.decide.byte_bound)
    "above the byte bound": NC_("decision", "above what the cut in bytes alone allows, so the kernel, not only the "
                                            "bytes, made the difference"),
    "within the byte bound": NC_("decision", "within what the cut in bytes alone allows"),
    "at the byte bound within the noise": NC_("decision", "at what the cut in bytes alone allows, within the noise"),
    # chapter 06: the ladder's best rung (helpers.decide.best_gain)
    "best, clear": NC_("decision", "the best: ahead of native eager and of every other rung beyond the noise"),
    "best, tied": NC_("decision", "ahead of native eager beyond the noise, but within the noise of the rungs named "
                                  "next, so none of them is the best"),
    "no gain beyond the noise": NC_("decision", "not ahead of native eager beyond the noise, so no rung is the best "
                                                "here"),
    "blocker: matmul kernels": NC_("decision", "the matmul kernels (they alone take longer than the goal's step)"),
    "blocker: the rest of the step": NC_("decision", "the rest of the step (the matmul kernels fit the goal's step; "
                                                     "attention, other kernels, Python and dispatch push it over)"),
}


def words(lang: str = "en") -> dict:
    """Every decision's phrase (``PHRASES``) as a reader of ``lang`` reads it."""
    return {key: phrase(key, lang) for key in PHRASES}


def phrase(key: str, lang: str = "en") -> str:
    """The phrase of the decision ``key`` in ``lang``: ``PHRASES``, through the runtime catalog."""
    if key not in PHRASES:
        raise KeyError(f"prose.PHRASES has no phrase for the decision {key!r}")
    english = PHRASES[key]
    return english if lang == SOURCE_LANGUAGE else runtime_translations(lang).pgettext(DECISION, english)


def say(decision: Any, lang: str = "en", *, mark=lambda fig, text: text) -> str:
    """What a ``helpers.decide`` decision says in ``lang`` (``phrase``), and for a ``decide.too_few``
    decision the too-few phrase with its counts put in. The chapters' templates (the ``say`` filter)
    and the worked answers both phrase decisions here, so a notebook never looks a decision up in
    the phrase table itself and never prints a decision's key. ``mark`` marks the counts as recorded
    figures in audit mode."""
    key = decision["decision"] if isinstance(decision, dict) else str(_plain(decision))
    few = decide.parse_too_few(key)
    if few is not None:  # "too few samples: 2 of 5": the phrase with the counts put in
        count, need = few
        # both counts are figures of the run's record and of decide's rule: marked as such
        return phrase(decide.TOO_FEW if count is not None else f"{decide.TOO_FEW}, {decide.UNKNOWN_COUNT}", lang
                      ).format(n=mark(Fig(count, "count of samples"), format_number(count)),
                               need=mark(Fig(need, "count needed (decide)"), format_number(need)))
    return phrase(key, lang)


def samples_in(values: Any) -> Optional[float]:
    """The fewest samples of the recorded figures among ``values`` (nested lists and figures'
    records included; plain numbers, a template's literals, count for nothing); None when no
    recorded figure is among them, so a comparison of unrecorded numbers claims no direction."""
    counts = []

    def walk(value):
        if isinstance(value, Record):
            value = value.get("value", None)
        if isinstance(value, Fig):
            counts.append(value.samples)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(values)
    return None if not counts or any(c is None for c in counts) else min(counts)


def ranking(rows: list, name: str, value: str, low: str = "p10_ms", high: str = "p90_ms",
            higher_is_better: bool = False, mark=lambda fig, text: text, sep: str = ", ") -> dict:
    """``decide.rank`` over table rows: ``names`` (the best, or every option tied with it, joined by
    ``sep``) and ``decision`` (a key of the phrase table: ``least time, clear`` / ``least time, tied``
    or, for ``higher_is_better``, ``most, clear`` / ``most, tied``; a ``decide.too_few`` decision when
    the rows have too few samples)."""
    rows = list(rows)
    found = decide.rank([(str(_plain(r[name])), _plain(r[value]), _plain(r.get(low)), _plain(r.get(high)))
                         for r in rows], higher_is_better,
                        samples=samples_in([[r.get(low), r.get(high)] for r in rows]))
    if found is None:
        return {"names": "", "decision": "not measured", "clear": False}
    # each name is a recorded word (marked as one in audit mode, like ``| text``)
    source = {str(_plain(r[name])): r[name] for r in rows}
    kind = "most" if higher_is_better else "least time"
    # a too_few ranking is never clear (decide.rank): its decision is the too_few one
    return {"names": sep.join(f"`{mark(source.get(n), n)}`" for n in found.tied), "clear": found.clear,
            "decision": found.too_few or f"{kind}, {'clear' if found.clear else 'tied'}"}


def translations(chapter: Optional[str], lang: str = "en") -> gettext.NullTranslations:
    """What ``{% trans %}`` says in ``lang`` for ``chapter``'s template: the English source itself for
    English, else the chapter's catalog, then the runtime one (where the sentences two chapters share
    are). A missing catalog is an error: a Chinese page never falls back to English silently."""
    if lang == SOURCE_LANGUAGE or chapter is None:
        return gettext.NullTranslations()
    path = catalog_path(chapter, lang)
    if not path.exists():
        raise FileNotFoundError(f"{chapter}.md.j2 has no {lang} catalog: write {path.relative_to(LOCALE.parent)} "
                                "(see CONTRIBUTING.md, 'One template, two languages')")
    found = copy.copy(read_catalog(path, path.stat().st_mtime))  # the cached catalog keeps no fallback
    found.add_fallback(runtime_translations(lang))
    return found


def environment(renderer: Renderer, lang: str = "en", chapter: Optional[str] = None):
    """The chapters' Jinja2 environment: the pages' one (``pages.template_environment``: strict about
    missing names, ``label``), plus filters for figures, ``say`` for decisions, ``decide`` as globals,
    and ``jinja2.ext.i18n`` with ``chapter``'s catalog in ``lang`` (newstyle gettext: every message
    is formatted with its named placeholders, so ``%`` is written ``%%`` in every msgid alike)."""
    env = pages.template_environment(lang, autoescape=False, folder=TEMPLATES)
    env.add_extension("jinja2.ext.i18n")
    env.install_gettext_translations(translations(chapter, lang), newstyle=True)
    env.filters.update(num=renderer.num, fig=renderer.fig, text=renderer.text, size=renderer.size,
                       count=renderer.count, unit=renderer.unit)
    def deep(value):
        return [deep(v) for v in value] if isinstance(value, (list, tuple)) else _plain(value)

    def unwrap(fn):
        def call(*args, **kwargs):
            # the count behind the figures compared: the fewest samples of any of them
            if fn is not decide.bandwidth_regime and "samples" not in kwargs:
                kwargs["samples"] = samples_in(list(args) + list(kwargs.values()))
            return fn(*[deep(a) for a in args], **{k: deep(v) for k, v in kwargs.items()})
        call.__name__ = fn.__name__
        return call

    env.globals.update({name: unwrap(getattr(decide, name)) for name in (
        "direction", "time_ratio_direction", "met", "effect", "bandwidth_regime", "changed", "byte_bound")})
    sep = env.globals["sep"]
    env.globals.update(pct=pct, ranking=lambda *a, **k: ranking(*a, mark=renderer.mark, sep=sep, **k),
                       column=lambda rows, name: [r[name] for r in rows],
                       spreads=lambda rows, low, high: [(r[low], r[high]) for r in rows],
                       rows_where=lambda rows, name, value: [r for r in rows if r.get(name) == value])
    # a dtype word an exercise proposes is the run's own word too: marked like a figure when auditing
    env.globals["other_dtype"] = lambda dtype, device: renderer.mark(
        Fig(other_dtype(dtype, device), "other_dtype"), other_dtype(dtype, device))
    env.filters["say"] = lambda decision: say(decision, lang, mark=renderer.mark)
    # a recorded word or sentence as recorded; a recorded message (a reason, a label, a table cell
    # a message made: context_of reads their records back) or a word of the runtime catalog in the
    # page's language
    env.filters["text"] = lambda value: renderer.mark(value, str(translate_cell(_plain(value), lang)))

    def plural(value: Any, one: str, other: str) -> str:
        """``one`` for a count of exactly 1 (a recorded figure, or a list: its length), else
        ``other``: "1 claim", "2 claims" (a language without plurals passes the same word twice)."""
        n = len(value) if isinstance(value, (list, tuple)) else _plain(value)
        return one if n == 1 else other

    env.filters["plural"] = plural
    env.tests["startswith"] = lambda value, prefix: str(_plain(value)).startswith(prefix)
    return env


def template_name(chapter: str, lang: str = "en") -> str:
    """The file that holds ``chapter``'s paragraphs, the same for every language (``lang`` is checked:
    its catalog translates the template's messages)."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang={lang!r} is not valid; choose one of {', '.join(LANGUAGES)}")
    return f"{chapter}.md.j2"


def _catalog_stamp(chapter: Optional[str], lang: str) -> Optional[tuple]:
    """When ``chapter``'s catalog and the runtime one for ``lang`` last changed (None without one):
    part of the key of a cached environment, so an edited catalog is read again."""
    if lang == SOURCE_LANGUAGE or chapter is None:
        return None
    paths = (catalog_path(chapter, lang), catalog_path(RUNTIME_DOMAIN, lang))
    return tuple(p.stat().st_mtime if p.exists() else None for p in paths)


@functools.lru_cache(maxsize=None)
def _cached_environment(templates: Path, locale: Path, stamp: Optional[tuple], audit: bool, lang: str,
                        chapter: Optional[str]):
    # Compiling a chapter's template is most of what a render costs (a few hundred ms for the larger
    # ones); one environment per folder, catalog, mode and language keeps each template compiled once
    # per process. Jinja's loader still checks the template file's time, so an edited template is
    # compiled again; the folders and the catalog's time are in the key for the same reason.
    return environment(Renderer(audit, lang), lang, chapter)


def chapter_environment(chapter: Optional[str], lang: str = "en", audit: bool = False):
    """``environment`` for ``chapter`` in ``lang``, built once per process and reused by every render."""
    return _cached_environment(TEMPLATES, LOCALE, _catalog_stamp(chapter, lang), audit, lang, chapter)


def blocks(chapter: str, lang: str = "en") -> list[str]:
    """The paragraph names a chapter's template defines."""
    return list(chapter_environment(None).get_template(template_name(chapter, lang)).blocks)


def render(chapter: str, block: str, results: dict, run: Optional[dict] = None, *, lang: str = "en",
           audit: bool = False, **extra) -> str:
    """One paragraph (``block``) of a chapter's template, from its recorded ``results``.

    ``extra`` may only hold words (a dtype name, a device), never numbers: numbers come from the
    results.
    """
    for key, value in extra.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise TypeError(f"{key}={value!r}: numbers reach a template only as recorded figures")
    return _render_block(chapter, template_name(chapter, lang), block, {**context_of(results, run), **extra},
                         lang, audit)


def answer_template_name(chapter: str, lang: str = "en") -> str:
    """The file that holds the paragraphs of ``chapter``'s worked answers; the chapter's catalog
    translates them (``lang`` is checked)."""
    template_name(chapter, lang)
    return f"{chapter}.answers.md.j2"


def answer(chapter: str, block: str, facts: dict, *, lang: str = "en", audit: bool = False) -> str:
    """One paragraph (``block``) of a chapter's worked answers, from ``facts``: what the answer
    measured or read (numbers, words, records of a figure with its spread), the template's ``a``.

    The rules of a chapter's paragraphs hold: numbers are ``facts``' figures, directions come from
    ``helpers.decide`` (a record's spread stands on its ``n_samples``; a record with a spread and no
    count says no direction, a plain number is exact), words from the facts."""
    context = {"chapter": chapter, "a": {
        key: _wrap(value, f"{chapter}.answer.{key}", "", None if isinstance(value, (dict, list)) else decide.EXACT)
        for key, value in facts.items()}}
    return _render_block(chapter, answer_template_name(chapter, lang), block, context, lang, audit)


def _render_block(chapter: str, name: str, block: str, context: dict, lang: str, audit: bool) -> str:
    template = chapter_environment(chapter, lang, audit).get_template(name)
    if block not in template.blocks:
        raise KeyError(f"{name} has no block {block!r}; it has {list(template.blocks)}")
    text = "".join(template.blocks[block](template.new_context(context))).strip()
    return join_wide_lines(text) if lang != SOURCE_LANGUAGE else text


# A line break between two East Asian wide characters is dropped, not shown as a space (the rule of
# CSS Text 3 for segment breaks, which browsers and Jupyter do not apply): a translated sentence
# that follows another on the template's next source line joins it.
_WIDE = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef"
_WIDE_BREAK = re.compile(f"(?<=[{_WIDE}])\n[ \t]*(?=[{_WIDE}])")


def join_wide_lines(text: str) -> str:
    """``text`` with every line break between two wide (CJK) characters removed, with the next
    line's indentation; a blank line (a new paragraph) and a break beside Latin text or code stay."""
    return _WIDE_BREAK.sub("", text)


# --- what helpers say to a reader at run time: messages of the "runtime" catalog --------------------
# A reason, a status, a verdict's detail, a table's label or an answer's paragraph that a helper
# composes is a ``Message``: its catalog key (an English msgid with ``{name}`` placeholders, formatted
# with ``str.format``) and its arguments. Its ``str`` is the English rendering, so code that prints,
# compares or records it as text keeps working; ``tr(message, lang)`` renders it in the reader's
# language through ``locale/<lang>/LC_MESSAGES/runtime.po`` (one domain for every helper and every
# worked answer; scripts/update_catalogs.py extracts the calls to ``message`` / ``tell`` / ``N_``).
# ``results.json`` keeps a message as its English text under its key and, beside it, the key and
# arguments under ``<key>_msg`` (``Message.record``), so old records and tools that read text still work.
DECISION = "decision"  # the context of a message that is a helpers.decide decision (``decision``)
MESSAGE_SUFFIX = "_msg"  # results.MESSAGE_SUFFIX: results.json's field beside a recorded message
TABLE_MESSAGES = "table_messages"  # results.TABLE_MESSAGES: the messages behind a record's table cells


class Message(str):
    """A sentence for the reader: ``msgid`` and ``args``; the ``str`` is its English rendering."""

    __slots__ = ("msgid", "args", "context")

    def __new__(cls, msgid: str, args: Optional[dict] = None, context: Optional[str] = None):
        args = dict(args or {})
        # without arguments a msgid is its text as it is (a recorded word may hold a brace)
        english = msgid if context == DECISION or not args else _format(msgid, args, SOURCE_LANGUAGE)
        self = super().__new__(cls, english)
        self.msgid, self.args, self.context = msgid, args, context
        return self

    def __reduce__(self):
        return (Message, (self.msgid, self.args, self.context))

    def record(self) -> dict:
        """What ``results.json`` keeps beside the English text: the key and the arguments (nested
        messages as their own records)."""
        out = {"msgid": self.msgid, "args": {k: _arg_record(v) for k, v in self.args.items()}}
        if self.context:
            out["context"] = self.context
        return out

    # results.with_messages looks for this name (results sits below prose and does not import it)
    message_record = record

    @classmethod
    def from_record(cls, record: Any, english: Any = None) -> Any:
        """The ``Message`` a record describes (``record``), or ``english`` (a plain text of an older
        record) when there is none."""
        if not isinstance(record, dict) or "msgid" not in record:
            return english
        args = {k: cls.from_record(v, v) if isinstance(v, dict) else
                [cls.from_record(i, i) for i in v] if isinstance(v, list) else v
                for k, v in (record.get("args") or {}).items()}
        return cls(record["msgid"], args, record.get("context"))


def _arg_record(value: Any) -> Any:
    if isinstance(value, Message):
        return value.record()
    if isinstance(value, (list, tuple)):
        return [_arg_record(v) for v in value]
    return value


def message(msgid: str, **args) -> Message:
    """A sentence for the reader, kept as its catalog key: ``message("run's shape {size} (the
    guide's is {theirs})", size=..., theirs=...)``. ``msgid`` is a literal (it is extracted into the
    catalog); an argument may be a number (formatted by the placeholder's spec, ``{ratio:.2f}``), a
    text, another message, or a list (joined with the language's list separator)."""
    return Message(msgid, args)


def decision(key: str) -> Message:
    """A ``helpers.decide`` decision inside a message: its key in English (as the records have always
    said it), its phrase (``say``) in another language."""
    return Message(str(key), None, DECISION)


def N_(msgid: str) -> str:
    """Marks a table's word (a column name, a category in a cell) for the catalog; ``show``
    translates it on the page. Returns it unchanged."""
    return msgid


def tell(lang: str, msgid: str, **args) -> str:
    """``tr(message(msgid, **args), lang)``: a worked answer's sentence in its edition's language."""
    return tr(Message(msgid, args), lang)


def _format(pattern: str, args: dict, lang: str) -> str:
    return pattern.format(**{k: _arg_text(v, lang) for k, v in args.items()})


def _arg_text(value: Any, lang: str) -> Any:
    if isinstance(value, Message):
        return tr(value, lang)
    if isinstance(value, (list, tuple)):
        return pages.list_separator(lang).join(str(_arg_text(v, lang)) for v in value)
    return value


def tr(value: Any, lang: str = SOURCE_LANGUAGE) -> Any:
    """``value`` for a reader of ``lang``: a ``Message`` rendered through the ``runtime`` catalog, a
    list of them joined; anything else (a recorded English text of an older run, a number, a
    name) as it is."""
    if isinstance(value, Message):
        if lang == SOURCE_LANGUAGE:
            return str.__str__(value)
        if value.context == DECISION:
            return say(value.msgid, lang)
        if not value.msgid:
            return ""
        catalog = runtime_translations(lang)
        pattern = catalog.pgettext(value.context, value.msgid) if value.context else catalog.gettext(value.msgid)
        return _format(pattern, value.args, lang) if value.args else pattern
    if isinstance(value, (list, tuple)) and any(isinstance(v, Message) for v in value):
        return pages.list_separator(lang).join(str(tr(v, lang)) for v in value)
    return value


def recorded(entry: Any, key: str, default: Any = "") -> Any:
    """A field of a record read back from ``results.json``: the ``Message`` its ``<key>_msg`` keeps,
    else the recorded text (an older record, or a field that was plain text)."""
    if not isinstance(entry, dict):
        return default
    return Message.from_record(entry.get(key + MESSAGE_SUFFIX), entry.get(key, default))


def recorded_rows(results: dict, name: str) -> Any:
    """The recorded table ``name`` of a chapter's ``results``, each cell that a message made read back
    as that ``Message`` (``results.table_messages``), so ``show`` and the ``text`` filter say it in the
    reader's language; a cell of an older record stays the English it holds."""
    rows = (results.get("tables") or {}).get(name)
    said = (results.get(TABLE_MESSAGES) or {}).get(name)
    if not said or not isinstance(rows, list):
        return rows
    return [{col: Message.from_record(said.get(str(i), {}).get(col), value) for col, value in row.items()}
            if isinstance(row, dict) else row for i, row in enumerate(rows)]


def translate_cell(value: Any, lang: str) -> Any:
    """One table cell for a reader of ``lang``: a ``Message`` rendered, a word of the catalog (``N_``)
    translated; anything else (numbers, names, identifiers, an older record's English) as it is."""
    if lang == SOURCE_LANGUAGE or not isinstance(value, str) or not value.strip():
        return value  # (gettext("") is the catalog's header)
    if isinstance(value, Message):
        return tr(value, lang)
    return runtime_translations(lang).gettext(value)


def show(frame: Any, lang: str = SOURCE_LANGUAGE) -> Any:
    """A table (DataFrame or Series) as a reader of ``lang`` sees it: column and index names through
    the ``runtime`` catalog, every text cell through ``translate_cell``. The recorded tables keep
    their English names (``results.table`` is given the frame itself); this is only the page's copy,
    and in English it is the frame itself."""
    import pandas as pd

    if lang == SOURCE_LANGUAGE or not isinstance(frame, (pd.DataFrame, pd.Series)):
        return frame  # in English, or not a table (a cell may show a note instead of one)

    catalog = runtime_translations(lang)
    name = lambda value: catalog.gettext(value) if isinstance(value, str) else value  # noqa: E731

    def cells(values):
        if not (pd.api.types.is_object_dtype(values) or pd.api.types.is_string_dtype(values)):
            return values
        seen = {}

        def one(value):
            if not isinstance(value, str):
                return value
            if value not in seen:
                seen[value] = translate_cell(value, lang)
            return seen[value]

        return values.map(one)

    def index(values):
        if isinstance(values, pd.MultiIndex) or not (pd.api.types.is_object_dtype(values)
                                                     or pd.api.types.is_string_dtype(values)):
            return values.rename(name(values.name)) if not isinstance(values, pd.MultiIndex) else values
        return pd.Index(cells(values.to_series()).values, name=name(values.name))

    if isinstance(frame, pd.Series):
        out = cells(frame)
        out.index = index(out.index)
        return out.rename(name(frame.name)) if frame.name is not None else out
    out = frame.copy()
    for i in range(out.shape[1]):
        out.isetitem(i, cells(out.iloc[:, i]))
    out.index = index(out.index)
    if not isinstance(out.columns, pd.MultiIndex):
        out.columns = [translate_cell(c, lang) for c in out.columns]
    return out


# The words every chapter's tables share (column names, categories in cells): ``show`` translates
# them on the page through the runtime catalog; the recorded tables keep the English.
TABLE_WORDS = (
    N_("value"), N_("unit"), N_("device"), N_("dtype"), N_("code_path"), N_("status"), N_("reason"),
    N_("name"), N_("model"), N_("median_ms"), N_("p10_ms"), N_("p90_ms"), N_("stdev_pct"), N_("noisy"),
    N_("iterations"), N_("first_call_s"), N_("n_samples"), N_("low"), N_("high"), N_("key"), N_("figure"),
    N_("source"), N_("verdict"), N_("error"), N_("problem"), N_("label"), N_("case"), N_("impl"),
    N_("variant"), N_("speedup"), N_("ratio"), N_("batch_size"), N_("prompt_tokens"), N_("new_tokens"),
    N_("prompt tokens"), N_("new tokens"), N_("tok/s"), N_("tokens_per_s"), N_("ttft_ms"), N_("ttft_p10_ms"),
    N_("ttft_p90_ms"), N_("decode_ms"), N_("decode_p10_ms"), N_("decode_p90_ms"), N_("decode_ms_per_token"),
    N_("bytes_per_step"), N_("achieved_gbps"), N_("gbps"), N_("bandwidth_gbps"), N_("peak_memory_bytes"),
    N_("layers"), N_("chapter"), N_("run"), N_("kernel"), N_("kind"), N_("detail"), N_("ok"), N_("skipped"),
    N_("failed"), N_("not run"), N_("measured"), N_("official"), N_("unofficial"), N_("yes"), N_("no"),
    N_("none"), N_("not measured"), N_("guide"), N_("dense"), N_("path"), N_("outcome"), N_("mode"),
    N_("order"), N_("rung"), N_("metric"), N_("claims"), N_("changed"), N_("evidence"), N_("claim"),
)
