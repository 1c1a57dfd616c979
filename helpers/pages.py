"""Every HTML page the workbook writes, from Jinja2 templates with one layout and one stylesheet
(layer: foundations; taught in 08_report).

The runner's ``index.html`` (``helpers.run``), the report chapter's ``claims_report.html``
(``helpers.report``, taught in ``08_report.ipynb``) and the compare page (``helpers.compare``) are
``templates/<kind>.html.j2``, each extending ``base.html.j2`` with ``workbook.css`` inlined, so a page
stays a single file that can be mailed or archived; figures are PNG data URIs (``png_data_uri``).
Every visible word comes from ``LABELS`` (at the end of this file), one table per page kind, in English;
another language reads each label through the runtime catalog (``helpers.catalogs``; a counted
word's forms under the context ``counted word``), so a page in Chinese is the same table translated
the way every other sentence is. The verdicts and verdict classes of ``helpers.claims`` are English keys;
their names and meanings are in the labels' ``common`` table, so a Chinese page
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
COUNTED = "counted word"  # the catalog context of a unit word's forms; a label is a plain message


def _same(*words: str) -> dict:
    """A label table whose keys are English words shown as they are (in English)."""
    return {word: word for word in words}


def languages() -> list[str]:
    return list(LANGUAGES)


def label_strings() -> list:
    """``(context, English label)`` of every label of ``LABELS`` (what the runtime catalog
    translates; ``scripts/update_catalogs.py`` extracts them). A label is the same message as the
    same word in a table or a sentence (one translation of "measured" for a page and a chapter)."""
    found = []
    _each_label(LABELS, lambda context, text: found.append((context, text)) or text)
    return found


def _each_label(table, say, counted: bool = False):
    """``table`` with ``say(context, text)`` in place of every label that is a message. A label
    without a letter (a sign, a "?") is the same in every language and not a message."""
    if isinstance(table, dict):
        return {key: _each_label(value, say, counted or key == "units") for key, value in table.items()}
    if isinstance(table, str) and any(c.isalpha() for c in table):
        return say(COUNTED if counted else None, table)
    return table


@functools.lru_cache(maxsize=None)
def label_table(lang: str) -> dict:
    if lang not in LANGUAGES:
        raise ValueError(f"lang={lang!r}: the pages have labels in {', '.join(LANGUAGES)} "
                         "(add the language's runtime catalog to offer another)")
    if lang == SOURCE_LANGUAGE:
        return LABELS
    found = runtime_translations(lang)
    return _each_label(LABELS, lambda context, text: found.pgettext(context, text) if context else found.gettext(text))


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
            raise KeyError(f"pages.LABELS has no table {path!r}")
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
    return f"{value:.4g}" if isinstance(value, float) else str(value)


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
    env.globals["sep"] = list_separator(lang)  # what joins a list's items in ``lang``
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
    """The page ``templates/<kind>.html.j2`` with its labels (``L``), the common ones (``C``) and
    ``context``."""
    table = labels(kind, lang)
    return environment(lang).get_template(f"{kind}.html.j2").render(
        kind=kind, lang=lang, html_lang=HTML_LANG.get(lang, lang), L=table, C=label_table(lang)["common"],
        css=stylesheet(), generated=time.strftime("%Y-%m-%d %H:%M:%S"), **context)


def write(path: "str | Path", kind: str, lang: str = "en", **context) -> Path:
    """Render and write atomically (readers never see half a page); the mode follows the umask."""
    path = Path(path)
    page = render(kind, lang, **context)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return path


# Every visible word of the workbook's pages, by page kind, in English; another language translates
# each label in its runtime catalog (helpers/locale/<lang>/LC_MESSAGES/runtime.po; the forms of a
# counted word under msgctxt "counted word"), where scripts/update_catalogs.py puts them. {name}
# fields are filled in by the templates (values are escaped); labels may hold simple HTML (<b>, <i>,
# <code>). helpers.claims names verdicts and verdict classes by their English keys; what a page shows
# for each key is here (common.verdicts, common.verdict_classes, common.class_meanings), so claims.py
# keeps one vocabulary and every language names them in its own words. Figure captions come from the
# plots, so they are not here. A label without a letter (a sign, a "?") is no message.
LABELS = {
    "common": {
        "load_sign": "⚠",
        # a chapter's figures taken under load (helpers.results.load_warning): its header and the index
        "load_warning": (
            "figures measured under load: CPU load average {load} on {cores} cores ({per_core} per "
            "core, above {threshold}) at the {when} of this chapter's measurements; busiest other "
            "processes: {busy}. Timings are inflated by them: rerun alone for figures to compare."
        ),
        "load_when": {"start": "start", "end": "end"},
        "generated": "Generated {when} from the runs' results.json files; nothing re-measured.",
        # one status per chapter (helpers.results.STATUSES) and the runner's words for a run or a solution
        "status": _same("ok", "skipped", "failed", "unfinished", "not run", "unreadable", "running",
                        "interrupted"),
        "columns": {**_same("chapter", "status", "reason", "figures", "device", "value", "unit", "dtype", "shape",
                            "run", "device class", "model"),
                    "duration_s": "duration (s)", "key": "figure", "code_path": "code path"},
        "boolean_yes": "yes",
        "boolean_no": "no",
        # helpers.claims.VERDICT_CLASSES: its keys, the name a page shows for each, and what each means
        # (in English, the same words as claims.py; tests/test_labels.py keeps them equal)
        "verdict_classes": _same("reproduced", "contradicted", "physically impossible",
                                 "contradicted by sources", "supported by sources", "guide inconsistent",
                                 "guide consistent", "measured on other hardware",
                                 "needs the claimed hardware", "not for inference", "not measured"),
        "class_meanings": {
            "reproduced": (
                "measured on the claimed hardware class with a comparable model (or computed, for "
                "device-independent claims) and within tolerance"
            ),
            "contradicted": (
                "measured on the claimed hardware class with a comparable model (or computed) and "
                "outside tolerance"
            ),
            "physically impossible": "faster or smaller than the hardware's peak allows (specs-table bound)",
            "contradicted by sources": "documentation, the specs table or an API check says otherwise",
            "supported by sources": (
                "documentation, the specs table or an API check agrees (not a measurement)"
            ),
            "guide inconsistent": "the guide's own figures disagree with each other",
            "guide consistent": "the guide's own figures agree with each other",
            "measured on other hardware": (
                "not decidable here; the same technique was measured on another device or model (same"
                " / opposite / no effect is shown)"
            ),
            "needs the claimed hardware": "within every bound; nothing comparable was measured",
            "not for inference": "the claim is about training and does not apply to inference",
            "not measured": "the chapter that measures it did not run or failed, or nothing measures it",
        },
        # helpers.claims.VERDICTS: the verdict of one claim, as its badge shows it
        "verdicts": _same("reproduced", "contradicted", "physically impossible", "API does not exist",
                          "API exists", "disagrees with sources", "agrees with sources",
                          "internally inconsistent", "internally consistent", "needs an NPU to check",
                          "needs a CUDA GPU to check", "does not apply to inference",
                          "not measured in this run"),
    },
    "index": {
        "load_summary": (
            "Figures of these chapters were measured under load (load average per core above "
            "{threshold}): {chapters}. Each row says when and which other processes were busiest."
        ),
        "title": "ascend-llama-workbook run {run_id}",
        "summary": (
            "Profile <b>{profile}</b>, started {started}, status <b>{status}</b>. Device: {device} "
            "({device_name}); torch {torch}, torch_npu {torch_npu}."
        ),
        "not_installed": "not installed",
        "notebook": "notebook",
        "duration": "duration",
        "key_figures": "key figures (measured in this run)",
        "files": "files",
        "link_notebook": "notebook",
        "link_html": "html",
        "link_results": "results.json",
        "seconds": "{s:.1f} s",
        "solution": "worked answers to the exercises of {chapter}",
        "verdict": "verdict",
        "claims": "claims",
        "verdicts_note": "Details, grouped by the guides' sections, are in the claims report of {chapter}.",
        "higher": "higher is better",
        "lower": "lower is better",
        "figure": "{name}: <b>{value}</b>",
        "direction": "({direction})",
        "spread": "(p10–p90 {low}–{high})",
        "spread_noise": "(p10–p90 {low}–{high}: {noise})",
        "too_few": "too few samples to say a direction: {n} of {need}",
        "too_few_unknown": "too few samples to say a direction: count not recorded, {need} needed",
        "verdicts_heading": {"one": "Claims of the guides by verdict ({n} claim)", "other": "Claims of the guides by verdict ({n} claims)"},
        "within_noise": "no difference beyond the noise",
        # unit words a figure is counted in (helpers.results units): a counted word's forms (gettext plurals)
        "units": {
            "claims": {"one": "claim", "other": "claims"},
            "ops": {"one": "op", "other": "ops"},
            "graphs": {"one": "graph", "other": "graphs"},
            "tokens": {"one": "token", "other": "tokens"},
        },
        # key figure -> label; a key ending in a batch size or rung name is matched by its prefix ({} is
        # that ending). helpers.report.FIGURE_DIRECTIONS says which way is better.
        "figures": {
            "device": "device the run used",
            "memory_bandwidth_gbps": "memory read bandwidth (torch.sum over a large buffer)",
            "decode_ceiling_tok_s": "batch-1 decode ceiling from bandwidth",
            "rmsnorm_guide_shape_ms": "RMSNorm time, fastest correct implementation",
            "rmsnorm_noncontig_slowdown": "RMSNorm slowdown on non-contiguous input",
            "add_rmsnorm_fusion_speedup": "fused add+RMSNorm speedup over eager",
            "ffn_merged_speedup_decode": "merged gate/up FFN speedup at decode shape",
            "ffn_fused_max_abs_diff": "fused FFN max abs difference vs reference",
            "residual_norm_graph_speedup": "residual+norm graph-mode speedup",
            "ttft_ms": "time to first token",
            "decode_tok_s_batch1": "decode speed at batch 1",
            "decode_roofline_pct": "batch-1 decode as share of the bandwidth ceiling",
            "graph_mode_decode_speedup": "graph-mode decode speedup over eager",
            "graph_compiled_graphs": "graphs compiled for decode",
            "eager_matmul_gbps": "weight matmuls timed alone (eager ATen), achieved bandwidth",
            "decode_matmul_share_pct": "share of the eager decode step in its weight-matmul kernels",
            "graph_compile_s": "graph compile time",
            "batched_outputs_match": "batched outputs match unbatched",
            "batched_outputs_match_working_dtype": "batched outputs match unbatched (working dtype)",
            "batch_throughput_ratio_": "aggregate decode throughput vs batch 1, batch {}",
            "kv_cache_mib_batch": "KV-cache size, batch {}",
            "int8_weight_bytes_ratio": "INT8 weight bytes / dense weight bytes",
            "int8_ppl_delta_pct": "INT8 perplexity change vs dense",
            "int8_decode_speedup_batch": "INT8 decode speedup over dense, batch {}",
            "int8_ttft_ratio_batch": "INT8 time to first token / dense, batch {}",
            "quantize_dynamic_ppl_ratio": "quantize_dynamic perplexity / reference",
            "ladder_best_batch1_speedup": "batch-1 ladder rung with the highest median, over native eager",
            "ladder_batch_throughput_ratio": "batched ladder rung throughput over native eager batch 1",
            "ladder_speedup_total": "ladder speedup, last rung over first (older runs)",
            "ladder_tok_s_": "ladder rung {} decode speed",
            "ladder_best_batch1_vs_llamacpp": (
                "batch-1 ladder rung with the highest median, over llama.cpp's decode, same run"
            ),
            "llamacpp_decode_tok_s": "llama.cpp decode speed (CPU reference, GGUF weights)",
            "dtype_choice": "working dtype, chosen by timing the model's forward per dtype",
            "vllm_server_start_s": "vLLM server start until healthy",
            "serving_output_tok_s_c": "served output throughput, concurrency {}",
            "serving_ttft_p50_ms_c": "served median time to first token, concurrency {}",
            "engine_batch1_decode_ratio": "vLLM batch-1 decode over our path's, same lengths",
            "users_served_ratio": "users served within the latency targets, vLLM over our path",
            "claims_total": "claims audited",
            "claims_": "claims with verdict: {}",
        },
    },
    "claims": {
        "title": "Claims audit: run {runs}",
        "intro": (
            "A verdict of reproduced or contradicted comes only from a measurement on the hardware "
            "class a claim is about, with a comparable model; the same technique measured elsewhere "
            "is shown in blue under the claim's own verdict."
        ),
        "legend": "Verdict classes",
        "class": "class",
        "claims": "claims",
        "meaning": "meaning",
        "id": "id",
        "says": "the guide says (Chinese quote, English gloss)",
        "verdict": "verdict",
        "why": "why (evidence)",
        "claimed": "claimed: {value}",
        "about_npu": "about a 910B",
        "about_cuda": "about an A100",
        "running": "running {model}",
        "shown_by": "(run {run})",
        "evidence": "evidence: {evidence}",
        # what decided a verdict (helpers.claims.Verdict.evidence)
        "evidence_kinds": _same("measured", "bound", "computed", "documentation", "guide", "none"),
        "decided_by": "; decided by {by}",
        "run": "run {run}",
        "runs": "Runs",
        "chapters": "Chapters in this run",
        "sources": "Specs: {specs}. API table: {api}.",
        "key_figures": "Key figures",
        "no_key_figures": "No chapter of this run recorded key figures.",
        "plots": "Plots",
    },
    "compare": {
        "title": "Comparison of {n} workbook runs",
        "intro": "Each figure is from the machine that produced its run.",
        "runs": "Runs",
        "run_columns": {
            "run": "run",
            "run_id": "run id",
            "device": "device",
            "device_name": "device name",
            "dtype": "dtype",
            "model": "model",
            "profile": "profile",
            "chapters": "chapters",
            "notes": "notes",
        },
        "none": "none",
        "unknown": "?",
        "notes": "Notes on reading the runs",
        "headline": "Headline figures",
        "not_recorded": "{title}: not recorded in any of these runs.",
        "plots": {
            "decode": "decode tok/s at batch 1 and 8",
            "ttft": "TTFT",
            "roofline": "decode as a share of the roofline",
            "ladder": "optimisation ladder",
        },
        "guide_heading": "The guide's 910B vs A100 table beside these runs (性能基准对比)",
        "guide_intro": (
            "The first columns are <b>the guide's claims</b> (Llama-2-7B fp16 on one 910B and one "
            "A100 80GB, from <code>data/guide_claims.csv</code>); the others are measured in each "
            "run, with its model, dtype, device and shape. A figure measured on another model, dtype "
            "or device is not the guide's number reproduced or contradicted: the claims audit below "
            "says which run decides each claim."
        ),
        # the hardware a claim is about (helpers.claims.HARDWARE's keys)
        "hardware": {"npu": "an Ascend NPU (910B)", "cuda": "a CUDA GPU (A100)"},
        "guide_columns": {
            "figure": "figure",
            "claim": "guide's claim about {about}",
            "measured": "measured: {run}",
        },
        "guide_rows": {
            "tok/s": "decode tok/s, batch 1",
            "ms": "first-token latency (TTFT), ms",
            "GB": "memory, GB",
        },
        "guide_claim": "{value} {unit} (claim {id}{about})",
        "guide_verdict": ": {verdict}",
        "guide_decided": ", decided by {run}",
        "figures_heading": "Every key figure, run by run",
        "figures_intro": (
            "Ratios are <b>run / {ref}</b>, given only when both figures have the same metric and "
            "unit, model, dtype and shape and both chapters finished; otherwise the cell says why "
            "not. The CSV beside this page has the same table with every field in its own column."
        ),
        "chapter": "chapter",
        "figure": "figure",
        "ratio_head": "{run} / {ref}",
        "no_ratio": "no ratio: {why}",
        "in_chapter": "(chapter {status})",
        "claims_heading": "Claims audit over all runs",
        "claims_intro": (
            "A claim about a 910B is decided by an NPU run, one about an A100 by a CUDA run; "
            "<i>decided by</i> names the run whose measurement decided it (empty when documentation, "
            "specs or the guide's own text decided it)."
        ),
        "claims_failed": "The claims audit over these runs failed: {error}",
        "claim_count": "{n} claim(s)",
        "claim_columns": {**_same("id", "section", "verdict", "elsewhere", "detail"),
                          "text_zh": "the guide says (Chinese)", "gloss_en": "claim (English gloss)",
                          "verdict_class": "verdict class", "decided_by": "decided by",
                          "device_class": "device class", "elsewhere_run": "shown by run"},
    },
}
