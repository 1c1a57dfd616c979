"""The guides' checkable claims and the rules that give each one a verdict
(layer: the guides' claims; taught in 08_report).

Layer: the guides' claims; taught in ``08_report.ipynb``. ``data/guide_claims.csv`` holds every claim with its original Chinese
text, an English gloss, the claimed value, the hardware class and model the claim is about, and the
name of a rule. ``verdicts(run_dirs)`` applies each rule to the evidence of one run folder or of
several (an NPU run, a CUDA run, a CPU run...): every chapter's ``results.json`` (never
re-measured), the device specs table (``data/device_specs.csv``) and chapter 00's API check. The
guide's optimisation ladder (``GUIDE_LADDER``) is here too, for chapters 05, 06 and 08.

"reproduced" / "contradicted" come only from a measurement on the hardware class the claim is about
(an NPU for a 910B claim, a CUDA GPU for an A100 claim) with a comparable model. The same technique
measured on another device or model gets an ``elsewhere`` verdict ("same effect on cpu ...") while the
claim itself stays "needs an NPU to check". Every verdict says what decided it (``evidence``) and,
when a measurement did, which run (``decided_by``) on which class of device (``device_class``).
"""
from __future__ import annotations

import ast
import csv
import math
import operator
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import decide, roofline
from .guide_api import api_check
from .prose import Message, N_, decision, message, recorded
from .results import device_class, read_run
from .roofline import LLAMA2_7B_CONFIG, llama2_weight_bytes, llama_parameter_count
from .versions import KNOWN_GOOD

# The words of this chapter's tables (column names, categories in cells): ``prose.show`` translates
# them on the page through the runtime catalog; the recorded tables keep the English.
TABLE_WORDS = (
    N_("reproduced"), N_("contradicted"), N_("physically impossible"), N_("contradicted by sources"),
    N_("supported by sources"), N_("guide inconsistent"), N_("guide consistent"),
    N_("measured on other hardware"), N_("needs the claimed hardware"), N_("not for inference"),
    N_("API does not exist"), N_("API exists"), N_("disagrees with sources"), N_("agrees with sources"),
    N_("internally inconsistent"), N_("internally consistent"), N_("does not apply to inference"),
    N_("bound"), N_("computed"), N_("documentation"), N_("section"), N_("gloss_en"), N_("text_zh"),
    N_("claimed_value"), N_("hardware"), N_("verdict_class"), N_("elsewhere"), N_("decided_by"),
    N_("measured_on"), N_("device class"), N_("figures"), N_("duration_s"), N_("plot"), N_("drawn"),
    N_("full run"), N_("only 00"), N_("with the table's bandwidth"), N_("at 800 GB/s"), N_("elsewhere_run"),
    N_("device_class"),
)


CLAIMS_CSV = Path(__file__).resolve().parent.parent / "data" / "guide_claims.csv"
COLUMNS = ("id", "seed", "section", "text_zh", "gloss_en", "kind", "claimed_value", "unit", "hardware", "model",
           "rule", "args")
KINDS = ("api", "performance", "ratio", "fact", "hardware")

# The hardware class a claim is about ('' for claims that hold on any device: APIs, formulas, the
# guide's own arithmetic) and the verdict it keeps until a run on that class measures it.
HARDWARE = {"npu": N_("an Ascend NPU (910B)"), "cuda": N_("a CUDA GPU (A100)")}
NEEDS = {"npu": N_("needs an NPU to check"), "cuda": N_("needs a CUDA GPU to check")}
NOT_MEASURED = N_("not measured in this run")

# The classes the index, the claims report and chapter 08 count verdicts in, with what each means.
VERDICT_CLASSES = {
    "reproduced": "measured on the claimed hardware class with a comparable model (or computed, for "
                  "device-independent claims) and within tolerance",
    "contradicted": "measured on the claimed hardware class with a comparable model (or computed) and "
                    "outside tolerance",
    "physically impossible": "faster or smaller than the hardware's peak allows (specs-table bound)",
    "contradicted by sources": "documentation, the specs table or an API check says otherwise",
    "supported by sources": "documentation, the specs table or an API check agrees (not a measurement)",
    "guide inconsistent": "the guide's own figures disagree with each other",
    "guide consistent": "the guide's own figures agree with each other",
    "measured on other hardware": "not decidable here; the same technique was measured on another device "
                                  "or model (same / opposite / no effect is shown)",
    "needs the claimed hardware": "within every bound; nothing comparable was measured",
    "not for inference": "the claim is about training and does not apply to inference",
    "not measured": "the chapter that measures it did not run or failed, or nothing measures it",
}
# Every verdict a rule gives, and its class; a "needs ..." verdict counts as "measured on other
# hardware" when another device measured the same technique (``verdict_class``).
VERDICTS = {
    "reproduced": "reproduced",
    "contradicted": "contradicted",
    "physically impossible": "physically impossible",
    "API does not exist": "contradicted by sources",
    "API exists": "supported by sources",
    "disagrees with sources": "contradicted by sources",
    "agrees with sources": "supported by sources",
    "internally inconsistent": "guide inconsistent",
    "internally consistent": "guide consistent",
    NEEDS["npu"]: "needs the claimed hardware",
    NEEDS["cuda"]: "needs the claimed hardware",
    "does not apply to inference": "not for inference",
    NOT_MEASURED: "not measured",
}
# One colour per class, shared by chapter 08's plot and the claims report's badges (white text reads on all).
CLASS_COLOURS = {
    "reproduced": "#1a7f37", "contradicted": "#cf222e", "physically impossible": "#82071e",
    "contradicted by sources": "#bc4c00", "supported by sources": "#0b7285", "guide inconsistent": "#8250df",
    "guide consistent": "#6f42c1", "measured on other hardware": "#0969da", "needs the claimed hardware": "#57606a",
    "not for inference": "#7d4e24", "not measured": "#8c959f",
}
# The two guides, by the seed file each claim row names.
GUIDES = {
    "000_4306e0a898c10b2f.txt": "CANN-ops-nn推理实战-昇腾NPU跑Llama如何让基础算子不掉链子 "
                                "(the ops-nn checklist: keeping the basic operators fast for Llama on an Ascend NPU)",
    "002_c082ff817235df57.txt": "昇腾NPU与Llama大模型性能优化实战指南 (the Llama performance guide for Ascend NPUs)",
}


# The guide's optimisation ladder (4.2 MindSpeed-LLM框架应用), a claim, not a measurement: Llama-2-7B
# fp16 on one 910B, 100 new tokens implied by 6012 ms at 16.6 tok/s. The MindSpeed rows cannot come
# from MindSpeed-LLM's inference script as the guide shows it (its Pipeline class does not exist).
# Chapter 06 draws it beside its own ladder, chapter 05 takes its INT8 step.
GUIDE_LADDER = [dict(zip(("rung", "label", "latency_ms", "tokens_per_s", "memory_gb"), row))
                for row in (("原生PyTorch", "native PyTorch", 6012, 16.6, 13.6),
                            ("+CANN优化", "+ CANN options", 4580, 21.7, 13.6),
                            ("+MindSpeed", "+ MindSpeed", 3250, 30.5, 13.6),
                            ("+MindSpeed+INT8", "+ MindSpeed + INT8", 2100, 47.2, 7.8))]


# What a claim's ``unlike=`` argument makes of a measurement: the figure the claim is checked against
# measures something else (another engine, another rung), so it shows no effect of the claim's
# technique, in either direction, and the claim is not "measured on other hardware".
UNLIKE = N_("unlike evidence")
# what a measurement elsewhere showed (``_seen``): a decide.effect decision and its figures
SEEN = N_("{effect}: {numbers}")


def verdict_class(verdict: str, elsewhere: str = "") -> str:
    """The class of a verdict; a "needs ..." verdict splits on whether another device measured it
    (the same technique: evidence ``UNLIKE`` the claim does not count)."""
    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r}; known: {', '.join(VERDICTS)}")
    if verdict in NEEDS.values() and elsewhere and not elsewhere.startswith(UNLIKE):
        return "measured on other hardware"
    return VERDICTS[verdict]


def _model_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name or "").lower())


def comparable_model(claimed: str, used: str) -> bool:
    """Is the run's model the one the claim is about? (``llama2-7b`` matches ``meta-llama/Llama-2-7b-hf``)."""
    return not claimed or (bool(used) and _model_key(claimed) in _model_key(used))


# --- claims table -----------------------------------------------------------------------------

def parse_args(text: str) -> dict[str, str]:
    """``"metric=04_batching.x;tolerance=0.25"`` -> dict; raises on a malformed pair."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(";"))):
        if "=" not in part:
            raise ValueError(f"rule argument {part!r} is not key=value")
        key, value = part.split("=", 1)
        out[key.strip()] = value.strip()
    return out


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


# The arguments of a claim's rule that are sentences a page shows (scripts/update_catalogs.py puts them
# in the runtime catalog, so a Chinese page says them in Chinese)
SAID_ARGS = ("note", "why", "where", "source", "factor_source", "unlike")


def _said(args: dict, key: str):
    """A sentence argument of a claim's rule (``SAID_ARGS``) as a message, '' when absent."""
    return Message(args[key]) if args.get(key) else ""


def number(text: "str | float | int") -> float:
    """A claimed number: ``"16.5"``, ``">1000"``, or arithmetic on the guide's figures (``"29.3/16.5"``)."""
    if isinstance(text, (int, float)):
        return float(text)
    text = str(text).strip().lstrip("<>=~").strip()

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"{text!r} is not a number or arithmetic on numbers")

    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"{text!r} is not a number or arithmetic on numbers") from None
    return ev(tree.body)


def claimed_range(text: str) -> tuple[float, float]:
    """``"0.05-0.1"`` -> (0.05, 0.1); a single value (``"1e-3"``, ``"29.3/16.5"``) gives (v, v)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*-\s*(\d+(?:\.\d+)?)\s*", str(text))
    if m:
        return float(m.group(1)), float(m.group(2))
    v = number(text)
    return v, v


def guide_number(claim_id: str, path: "str | Path | None" = None) -> float:
    """The number a claim of ``data/guide_claims.csv`` states (``"29.3/16.5"`` gives the ratio).

    Notebooks take the guides' figures from here, so each figure is typed once, with its quote.
    """
    table = load_claims(path)
    row = table[table["id"] == claim_id]
    if row.empty:
        raise KeyError(f"claim {claim_id!r} is not in the claims table")
    return number(row.iloc[0]["claimed_value"])


def load_claims(path: "str | Path | None" = None):
    """The claims table as a DataFrame; every row is checked so a bad row fails loudly here."""
    import pandas as pd

    path = Path(path) if path else CLAIMS_CSV
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{path} holds no claims")
    missing = [c for c in COLUMNS if c not in rows[0]]
    if missing:
        raise ValueError(f"{path} lacks columns {missing}; expected {list(COLUMNS)}")
    seen = set()
    for row in rows:
        where = f"claim {row['id']!r} in {path.name}"
        if row["id"] in seen:
            raise ValueError(f"{where}: duplicate id")
        seen.add(row["id"])
        if row["kind"] not in KINDS:
            raise ValueError(f"{where}: kind={row['kind']!r}; choose one of {', '.join(KINDS)}")
        if row["rule"] not in RULES:
            raise ValueError(f"{where}: rule={row['rule']!r}; known rules: {', '.join(RULES)}")
        if row["hardware"] not in ("", *HARDWARE):
            raise ValueError(f"{where}: hardware={row['hardware']!r}; choose one of {', '.join(HARDWARE)} or "
                             "leave it empty for a device-independent claim")
        for col in ("text_zh", "gloss_en", "claimed_value", "seed"):
            if not row[col].strip():
                raise ValueError(f"{where}: empty {col}")
        parse_args(row["args"])
    return pd.DataFrame(rows, columns=list(COLUMNS))


# --- evidence ---------------------------------------------------------------------------------

@dataclass
class Evidence:
    """What a verdict may use: results of every chapter, specs, chapter 00's API table."""

    results: dict = field(default_factory=dict)
    specs: list = field(default_factory=list)
    specs_source: str = ""
    api_rows: list = field(default_factory=list)
    api_source: str = ""
    run_dir: str = ""
    device: str = ""  # the run's device (``RunFolder.device``)
    states: dict = field(default_factory=dict)  # chapter -> (status, reason), as ``helpers.results`` reads them

    @property
    def run_name(self) -> str:
        return Path(self.run_dir).name if self.run_dir else ""

    @property
    def device_class(self) -> str:
        return device_class(self.device)

    def chapter_device(self, chapter: str, entry: Optional[dict] = None) -> str:
        """Where a figure was measured: the entry's own ``device``, else its chapter's environment."""
        if entry and entry.get("device"):
            return str(entry["device"])
        return str((self.results.get(chapter) or {}).get("environment", {}).get("device", ""))

    def chapter_model(self, chapter: str) -> str:
        """The model a chapter ran with (its ``parameters``), else chapter 00's."""
        for name in (chapter, "00_environment_check"):
            model = (self.results.get(name) or {}).get("parameters", {}).get("model")
            if model:
                return str(model)
        return ""

    def samples(self, chapter: str, entry: Optional[dict] = None) -> Optional[float]:
        """How many samples a chapter's figure stands on: its own count, else the chapter's
        ``repeats`` / ``rounds`` / ``min_iters`` (``decide.samples_of``, ``decide.chapter_samples``)."""
        default = decide.chapter_samples((self.results.get(chapter) or {}).get("parameters"))
        return default if entry is None else decide.samples_of(entry, default)

    def entry(self, dotted: str) -> Optional[dict]:
        """``"04_batching.batch_throughput_ratio_4"`` -> the metric entry, if the chapter recorded it."""
        chapter, _, key = dotted.partition(".")
        entry = (self.results.get(chapter) or {}).get("metrics", {}).get(key)
        return None if entry is None or entry.get("value") is None else entry

    def rows(self, chapter: str, table: str) -> list:
        """A table the chapter recorded (``[]`` when it recorded none)."""
        return (self.results.get(chapter) or {}).get("tables", {}).get(table) or []

    def chapter_state(self, chapter: str) -> str:
        """The chapter's status as every page shows it, with the reason when it did not finish."""
        status, reason = self.states.get(chapter, ("not run", ""))
        return status if status in ("ok", "skipped", "not run") or not reason else f"{status} ({reason})"

    def spec(self, device: str, column: str) -> tuple[Optional[float], str]:
        """The most generous ``column`` among specs rows whose device and variant contain ``device``."""
        if column not in roofline.SPEC_NUMBERS:
            raise ValueError(f"specs column {column!r}: the specs table has {', '.join(roofline.SPEC_NUMBERS)}")
        matches = [r for r in self.specs if r.get(column) is not None
                   and device.lower() in f"{r['device']} {r['variant']}".lower()]
        if not matches:
            return None, ""
        best = max(matches, key=lambda r: r[column])
        return float(best[column]), message("{device} {variant}: {value:g} ({source}; {status}; from {table})",
                                            device=best["device"], variant=best["variant"], value=best[column],
                                            source=Message(best["source"]), status=Message(best["status"]),
                                            table=self.specs_source)


def gather_evidence(run_dir: "str | Path", specs_path=None) -> Evidence:
    """Read a run folder (never re-measure): every chapter but this report, specs, API table."""
    run = read_run(run_dir)
    results = run.results()
    specs = roofline.load_specs(specs_path)
    specs = specs.astype(object).where(specs.notna(), None).to_dict(orient="records")
    specs_source = Path(specs_path or roofline.SPECS_PATH).name
    api_rows = (results.get("00_environment_check") or {}).get("tables", {}).get("api_check")
    if api_rows:
        api_source = message("chapter 00 api_check table of this run")
    else:
        api_rows = api_check(None)
        api_source = message("helpers.guide_api.API_CLAIMS (documented; chapter 00 did not run)")
    return Evidence(results, specs, specs_source, list(api_rows), api_source, str(run_dir), run.device,
                    {n: (c.status, c.reason) for n, c in run.chapters.items()})


# --- rules ------------------------------------------------------------------------------------

@dataclass
class Verdict:
    verdict: str
    detail: str
    evidence: str  # measured / bound / computed / documentation / guide / none
    measured: Any = None
    measured_on: str = ""
    ratio: Optional[float] = None  # measured / claimed
    elsewhere: str = ""  # the same technique measured on another device or model, e.g. "same effect on cpu"
    device_class: str = ""  # of the measurement that decided the verdict ('' when none did)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")


def _context(entry: dict) -> Any:
    """Where a figure was measured: its device, dtype, shape and code path, each a recorded message
    where one made it (so a page says them in its language), joined as a list; '' without any."""
    parts = [recorded(entry, k) for k in ("device", "dtype", "shape", "code_path") if entry.get(k)]
    return message("{parts}", parts=parts) if parts else ""


def _spread(entry: Optional[dict]) -> tuple[Optional[float], Optional[float]]:
    """The recorded p10-p90 spread of a figure (``low``/``high``), when the chapter recorded one."""
    for lo, hi in (("low", "high"), ("p10", "p90")):
        if entry and entry.get(lo) is not None and entry.get(hi) is not None:
            return float(entry[lo]), float(entry[hi])
    return None, None


def _judged(claim: dict, ev: Evidence, chapter: str, entry: dict, ok: bool, detail: str, measured: Any,
            ratio: Optional[float], seen: str) -> Verdict:
    """A measurement's verdict: reproduced / contradicted only on the claim's hardware and model.

    Elsewhere (another device class, or the right device with another model) the claim keeps its
    "needs ..." verdict and ``seen`` ("same effect", "holds", ...) describes what this device showed.
    """
    device = ev.chapter_device(chapter, entry)
    cls = device_class(device)
    model = ev.chapter_model(chapter)
    target, want_model = claim.get("hardware", ""), claim.get("model", "")
    on = _context(entry) or device
    unlike = _said(parse_args(claim.get("args", "")), "unlike")
    label, numbers = (seen.args.get("effect", seen), seen.args.get("numbers", "")) if isinstance(seen, Message) \
        and seen.msgid == SEEN else (seen, "")
    if unlike:  # the figure measures something else than the claim: it neither reproduces nor contradicts
        label, numbers = message("{unlike} ({what})", unlike=Message(UNLIKE), what=unlike), numbers or label
        if not target or (cls == target and comparable_model(want_model, model)):
            return Verdict(NOT_MEASURED, message("{detail}; model {model}; {unlike}: {what}", detail=detail,
                                                 model=model or "?", unlike=Message(UNLIKE), what=unlike),
                           "measured", measured, on, ratio, device_class=cls)
    if not target or (cls == target and comparable_model(want_model, model)):
        return Verdict("reproduced" if ok else "contradicted",
                       message("{detail}; model {model}", detail=detail, model=model or "?"), "measured",
                       measured, on, ratio, device_class=cls)
    about = (message("{hardware} running {model}", hardware=Message(HARDWARE[target]), model=want_model)
             if want_model else Message(HARDWARE[target]))
    elsewhere = message("{effect} on {device} ({model})", effect=label, device=device or "?", model=model or "?")
    return Verdict(NEEDS[target], message("{detail}; measured on {device} with {model}, but the claim is about "
                                          "{about}", detail=detail, device=device or "?", model=model or "?",
                                          about=about), "measured", measured, on, ratio,
                   elsewhere=message("{elsewhere}: {numbers}", elsewhere=elsewhere, numbers=numbers)
                   if numbers else elsewhere, device_class=cls)


def _seen(claim: dict, args: dict, measured: float, ok: bool, entry: Optional[dict] = None,
          samples: Optional[float] = None) -> str:
    """What a measurement elsewhere shows (``decide.effect``): same / smaller / larger / opposite
    effect, or none beyond the noise, from the recorded spread (else ``noise`` around the value);
    for figures that are not ratios or percentages, holds / does not hold. ``samples``: how many
    samples the figure stands on (``decide.samples_of``); from too few no effect is read."""
    unit = claim.get("unit", "")
    neutral = float(args["neutral"]) if "neutral" in args else {"x": 1.0, "%": 0.0}.get(unit)
    if neutral is None:
        return message("holds") if ok else message("does not hold")
    noise = float(args.get("noise", 0.05 if unit == "x" else 2.0))
    claimed = number(claim["claimed_value"])
    factor = float(args.get("factor", decide.SAME_EFFECT_FACTOR))
    if claimed == neutral:  # a claim like "speedup > 1" states a direction, not a size
        claimed = neutral + (1 if args.get("op", ">") in (">", ">=") else -1)
        factor = math.inf
    low, high = _spread(entry)
    text = decide.effect(claimed, measured, neutral, low=low, high=high,
                         noise=noise * abs(neutral) if neutral else noise, factor=factor,
                         samples=samples if entry is not None and decide.has_spread(entry) else decide.EXACT)
    shown = (f"{args['op']} " if "op" in args else "") + f"{number(claim['claimed_value']):.3g}"
    spread = message(" (spread {low:.3g}-{high:.3g})", low=low, high=high) if low is not None else ""
    numbers = message("{measured:.3g}{unit}{spread} vs claimed {shown}{unit}", measured=measured, unit=unit,
                      spread=spread, shown=shown)
    if not math.isinf(factor):
        numbers = message("{numbers}; same effect means within {factor:g}x of the claimed size", numbers=numbers,
                          factor=factor)
    return Message(SEEN, {"effect": decision(text), "numbers": numbers})


def _not_measured(ev: Evidence, dotted: str) -> Verdict:
    chapter, _, name = dotted.partition(".")
    state = ev.chapter_state(chapter)
    why = (message("{chapter} {state}", chapter=chapter, state=Message(state)) if state not in ("ok", "skipped")
           else message("{chapter} ({state}) did not record {name}", chapter=chapter, state=Message(state), name=name))
    recorded = ev.results.get(chapter, {})
    # a chapter that ran but could not record the figure says why (``Results.not_recorded``)
    from_record = Message.from_record
    reason = (from_record(recorded.get("status_reason_msg"), recorded.get("status_reason"))
              or from_record((recorded.get("not_recorded_msg") or {}).get(name),
                             (recorded.get("not_recorded") or {}).get(name, "")))
    return Verdict(NOT_MEASURED, message("{why}: {reason}", why=why, reason=reason) if reason else why, "none")


def rule_api(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A guide API name, judged by chapter 00's table (live hasattr where torch_npu imports)."""
    name, source = args["name"], ev.api_source
    row = next((r for r in ev.api_rows if r.get("guide_name") == name), None)
    if row is None:
        return Verdict(NOT_MEASURED, message("{name} is in no API table ({source})", name=name, source=source),
                       "none")
    live, real = row.get("exists_here"), row.get("real_api", "")
    documented = str(row.get("documented", ""))
    said = Message(documented)  # the API table's documented sentences are catalog words (guide_api)
    if live is True:
        return Verdict("API exists", message("hasattr check on this machine found {name}; documented: {documented}",
                                             name=name, documented=said), "measured", True, device_class=ev.device_class)
    if live is False and "set-only" in documented:
        # a set-only attribute has no getter, so hasattr is False on a real NPU too: trust the docs
        return Verdict("API exists", message("{documented}; the live hasattr check is False because the attribute "
                                             "has no getter, which is expected (source: {source})",
                                             documented=said, source=source), "documentation")
    if live is False:
        return Verdict("API does not exist", message("hasattr check on this machine: missing. Real API: {real}",
                                                     real=real), "measured", False, device_class=ev.device_class)
    if documented.lower().startswith(("does not exist", "no ")):
        return Verdict("API does not exist", message("{documented}. Real API: {real} (source: {source})",
                                                     documented=said, real=real, source=source), "documentation")
    return Verdict("API exists", message("{documented}; real form: {real} (source: {source}; live check needs "
                                         "torch_npu)", documented=said, real=real, source=source), "documentation")


_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def rule_measured(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A recorded figure against the claimed one (rules ``ratio`` and ``threshold``).

    ``ratio``: within a relative ``tolerance`` (default 25 %) or an absolute ``abs_tol`` of it.
    ``threshold``: ``measured <op> claimed`` (a max-abs difference below 1e-3, a speedup of at least
    3x); ``tolerance`` loosens the bound by that fraction in the claim's favour (``>= 3`` with
    tolerance 0.25 accepts 2.25), and ``requires=key:value`` names a field the chapter must record
    beside the figure for it to test the claim.
    """
    claimed = number(claim["claimed_value"])
    op = args.get("op", "<") if claim["rule"] == "threshold" else None
    if op is not None and op not in _CMP:
        raise ValueError(f"claim {claim['id']}: op={op!r}; choose one of {', '.join(_CMP)}")
    entry = ev.entry(args["metric"])
    note = _said(args, "note")
    if entry is None:
        v = _not_measured(ev, args["metric"])
        if note and not op:
            v.detail = message("{detail} ({note})", detail=v.detail, note=note)
        return v
    if "requires" in args:
        key, _, wanted = args["requires"].partition(":")
        if str(entry.get(key)).lower() != wanted.lower():
            why = _said(args, "why") or message("the figure does not test the claim")
            return Verdict(NOT_MEASURED, message("{metric} was recorded with {key}={value!r}, not {wanted}: {why}",
                                                 metric=args["metric"], key=key, value=entry.get(key), wanted=wanted,
                                                 why=why), "none")
    measured = float(entry["value"])
    on = _context(entry) or "?"
    if op is not None:
        tol = float(args.get("tolerance", 0.0))
        bound = claimed * (1 - tol) if op in (">", ">=") else claimed * (1 + tol)
        ok = _CMP[op](measured, bound)
        shown = (message("{claimed:g} (tolerance {tol:.0%}: {bound:.3g})", claimed=claimed, tol=tol, bound=bound)
                 if tol else f"{claimed:g}")
        detail = (message("measured {measured:.3g} {op} {shown}; on {on}", measured=measured, op=op, shown=shown, on=on)
                  if ok else message("measured {measured:.3g} is not {op} {shown}; on {on}", measured=measured, op=op,
                                     shown=shown, on=on))
        ratio = measured / claimed if claimed and op in (">", ">=") else None
    else:
        if "abs_tol" in args:
            tol = float(args["abs_tol"])
            ok = abs(measured - claimed) <= tol
            rule_text = message("|measured - claimed| = {diff:.3g} vs tolerance {tol:g}", diff=abs(measured - claimed),
                                tol=tol)
        else:
            tol = float(args.get("tolerance", 0.25))
            ok = claimed != 0 and abs(measured / claimed - 1) <= tol
            rule_text = message("measured/claimed = {ratio:.2f} (tolerance ±{tol:.0%})", ratio=measured / claimed
                                if claimed else math.nan, tol=tol)
        ratio = measured / claimed if claimed else None
        unit = claim["unit"] and " " + claim["unit"]
        detail = message("measured {measured:.3g}{unit} vs claimed {claimed:.3g}: {rule}; on {on}", measured=measured,
                         unit=unit, claimed=claimed, rule=rule_text, on=on)
        if note:
            detail = message("{detail} ({note})", detail=detail, note=note)
    return _judged(claim, ev, args["metric"].partition(".")[0], entry, ok, detail, measured, ratio,
                   _seen(claim, args, measured, ok, entry, ev.samples(args["metric"].partition(".")[0], entry)))


def rule_speedup_every_shape(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A "mode B is faster" claim, judged at every shape a chapter timed (from its table, eager / graph).

    One shape's speedup does not carry a claim about a block that runs at prefill and at decode shape:
    the claim holds only where the faster mode wins at each of them.
    """
    chapter, _, name = args["table"].partition(".")
    by_case: dict = {}
    for row in ev.rows(chapter, name):
        mode = str(row.get("mode", "")).split()[0]
        if row.get("median_ms"):
            by_case.setdefault(row.get("case", "?"), {})[mode] = float(row["median_ms"])
    slow, fast = args["slow"], args["fast"]
    ratios = {case: t[slow] / t[fast] for case, t in by_case.items() if slow in t and fast in t}
    if not ratios:
        return _not_measured(ev, args["table"])
    shown = "; ".join(f"{case}: {r:.2f}x" for case, r in ratios.items())
    detail = message("{slow} / {fast} time per shape: {shown} (the claim needs > 1 at each)", slow=slow, fast=fast,
                     shown=shown)
    noise = float(args.get("noise", 0.05))
    counts = [ev.samples(chapter, row) for row in ev.rows(chapter, name)]
    samples = None if any(c is None for c in counts) else min(counts, default=None)
    sides = {decide.effect(2.0, r, 1.0, noise=noise, factor=math.inf, samples=samples) for r in ratios.values()}
    seen = decision(sides.pop()) if len(sides) == 1 else message("mixed effect")
    ok = all(r > 1 for r in ratios.values())
    entry = {"device": ev.chapter_device(chapter)}
    return _judged(claim, ev, chapter, entry, ok, detail, min(ratios.values()), None,
                   Message(SEEN, {"effect": seen, "numbers": shown}))


def rule_bound(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """Latency (ms) or decode rate (tok/s) against the device's bandwidth and compute bounds.

    The fastest any implementation can be is max(bytes / bandwidth, flops / peak), over ``devices``
    chips at their (generous) spec. A claim faster than that is physically impossible; otherwise an
    NPU measurement of this run decides it, or it waits for one.
    """
    device, n, unit = args["device"], int(args.get("devices", 1)), claim["unit"]
    want = claim.get("hardware") or ("npu" if "910" in device else "cuda")
    bw, bw_src = ev.spec(device, "bandwidth_gbps")
    flops, fl_src = ev.spec(device, "fp16_dense_tflops")
    nbytes = number(args["bytes"]) if "bytes" in args else float(llama2_weight_bytes(args.get("weights", "float16")))
    prompt = int(args.get("prompt_tokens", 0))
    work = 2 * llama_parameter_count(**LLAMA2_7B_CONFIG) * prompt if prompt else 0.0
    low, high = claimed_range(claim["claimed_value"])
    if unit == "tok/s":  # the most lenient end: the slowest claimed rate
        claimed_s, shown = 1.0 / low, message("{rate:g} tok/s = {ms:.3g} ms per token", rate=low, ms=1e3 / low)
    elif unit == "ms":  # the most lenient end: the longest claimed time
        claimed_s, shown = high / 1e3, f"{high:g} ms"
    else:
        raise ValueError(f"claim {claim['id']}: rule bound needs unit tok/s or ms, not {unit!r}")
    if bw is None:
        return Verdict(NEEDS[want], message("no bandwidth for {device} in {source}", device=device,
                                            source=ev.specs_source), "none")
    t_mem = nbytes / (bw * 1e9 * n)
    t_cmp = work / (flops * 1e12 * n) if (work and flops) else 0.0
    bound = max(t_mem, t_cmp)
    how = (f"{nbytes / 1e9:.3g} GB / ({n} x {bw:g} GB/s) = {t_mem * 1e3:.3g} ms"
           + (f"; {work / 1e9:.3g} GFLOP / ({n} x {flops:g} TFLOPS) = {t_cmp * 1e3:.3g} ms" if t_cmp else ""))
    if claimed_s < bound:
        source = message("spec {source}", source=bw_src)
        if t_cmp:
            source = message("{detail}; {note}", detail=source, note=fl_src)
        need = nbytes / claimed_s / 1e12
        return Verdict("physically impossible",
                       message("claimed {shown}, but the floor is {how} (it would need {need:.3g} TB/s); {source}",
                               shown=shown, how=how, need=need, source=source), "bound", ratio=bound / claimed_s)
    chapter = str(args.get("metric", "")).partition(".")[0]
    entry = ev.entry(args["metric"]) if args.get("metric") else None
    if entry and (device_class(ev.chapter_device(chapter, entry)) != want
                  or args.get("context", "") not in str(entry.get("context", ""))):
        entry = None  # measured on another kind of device, or at the profile's shape, not the guide's
    other_model = ""
    if entry and comparable_model(claim.get("model", ""), ev.chapter_model(chapter)):
        measured = float(entry["value"])
        ok = low * 0.75 <= measured <= high * 1.25  # the guides give no tolerance; ±25 % of the range
        return _judged(claim, ev, chapter, entry, ok,
                       message("measured {measured:.3g} {unit} vs claimed {claimed} {unit} (±25%)", measured=measured,
                               unit=unit, claimed=claim["claimed_value"]), measured, measured / ((low + high) / 2), "")
    if entry:  # the right device, another model: an absolute figure says nothing here
        other_model = message("; this run's {chapter} measured {value:.3g} {unit} on {device} with {model}, not "
                              "{claimed_model}", chapter=chapter, value=float(entry["value"]), unit=unit,
                              device=ev.chapter_device(chapter, entry), model=ev.chapter_model(chapter) or "?",
                              claimed_model=claim.get("model") or message("the claimed model"))
    return Verdict(NEEDS[want], message("within the bound (floor {how}; claimed {shown}); run {where}{other}", how=how,
                                        shown=shown, where=_said(args, "where") or message(
                                            "the matching chapter on that device"), other=other_model),
                   "bound", ratio=bound / claimed_s)


def _table_value(ev: Evidence, spec: str):
    """``"06_optimization_ladder.ladder[0].peak_memory_bytes"`` -> (chapter, value, description) or None.

    The row is an index among rows whose status is ok (or that have none), or a rung name (``[INT8]``).
    """
    m = re.fullmatch(r"(\w+)\.(\w+)\[([^\]]+)\]\.(\w+)", spec.strip())
    if not m:
        raise ValueError(f"table reference {spec!r} is not chapter.table[row].column (row: an index or a rung name)")
    chapter, name, which, column = m.groups()
    rows = [r for r in ev.rows(chapter, name) if r.get("status", "ok") == "ok"]
    if which.isdigit():
        row = rows[int(which)] if len(rows) > int(which) else None
    else:  # the last rung whose name contains the text (the ladder is cumulative)
        row = next((r for r in reversed(rows) if which.lower() in str(r.get("rung", "")).lower()), None)
    if row is None or row.get(column) in (None, ""):
        return None
    return chapter, float(row[column]), f"{chapter} table {name}, rung {row.get('rung', which)}"


def rule_weight_memory(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A memory/storage figure (GB) against the weights it must hold, in GB and GiB readings."""
    claimed = number(claim["claimed_value"])
    weights = llama2_weight_bytes(args.get("weights", "float16"))
    as_gb, as_gib, ratio = claimed * 1e9, claimed * 2**30, claimed * 1e9 / weights
    text = message("Llama-2-7B {weights} weights are {gb:.2f} GB ({gib:.2f} GiB)", weights=args.get("weights", "float16"),
                   gb=weights / 1e9, gib=weights / 2**30)
    if max(as_gb, as_gib) < weights:
        return Verdict("physically impossible", message("claimed {claimed:g} GB holds less than the weights: {text}",
                                                        claimed=claimed, text=text), "bound", ratio=ratio)
    if args.get("mode") == "storage":
        return Verdict("agrees with sources", message("{claimed:g} GB holds the weights ({text}) with room for a "
                                                      "second copy in another format", claimed=claimed, text=text),
                       "bound", ratio=ratio)
    target = claim.get("hardware") or "npu"
    found = _table_value(ev, args["peak"]) if "peak" in args else None
    if found is not None:
        chapter, value, where = found
        cls = device_class(ev.chapter_device(chapter))
        if cls == target and comparable_model(claim.get("model", ""), ev.chapter_model(chapter)):
            measured_gb, tol = value / 1e9, float(args.get("tolerance", 0.10))
            return _judged(claim, ev, chapter, {}, abs(measured_gb / claimed - 1) <= tol,
                           message("peak memory {measured:.3g} GB ({where}) vs claimed {claimed:g} GB (tolerance "
                                   "±{tol:.0%}); {text}", measured=measured_gb, where=where, claimed=claimed, tol=tol,
                                   text=text), measured_gb, measured_gb / claimed, "")
    note = message(" (only under a GiB reading of the unit)") if as_gb < weights else ""
    return Verdict(NEEDS[target], message("claimed {claimed:g} GB covers the weights{note}: {text}; the peak memory "
                                          "needs {peak} from a run on {hardware} with {model}", claimed=claimed,
                                          note=note, text=text, peak=args.get("peak") or message("a peak-memory figure"),
                                          hardware=Message(HARDWARE[target]),
                                          model=claim.get("model") or message("the model")), "bound", ratio=ratio)


def rule_fits(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """Does the model's weights fit one device? (the guide says it needs model parallelism)."""
    size = str(args["model"]).lower().replace("llama2-", "").replace("llama-2-", "")  # llama2-13b -> 13b
    weights = llama2_weight_bytes(args.get("weights", "float16"), size)
    mem, src = ev.spec(args["device"], "memory_gb")
    if mem is None:
        return Verdict(NOT_MEASURED, message("no memory size for {device}", device=args["device"]), "none")
    facts = dict(model=args["model"], weights=args.get("weights", "float16"), gb=weights / 1e9,
                 device=src.split(":")[0], memory=mem)
    fits = weights < mem * 1e9
    detail = (message("{model} {weights} weights are {gb:.1f} GB; one {device} has {memory:g} GB: it fits on one card "
                      "(tensor parallelism is needed on 32 GB cards, and for 70B)", **facts) if fits
              else message("{model} {weights} weights are {gb:.1f} GB; one {device} has {memory:g} GB: it does not "
                           "fit on one card", **facts))
    return Verdict("disagrees with sources" if fits else "agrees with sources", detail, "bound",
                   ratio=weights / (mem * 1e9))


def rule_spec(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A hardware figure against the specs table (the table's source and confidence are shown), or,
    with ``derive_from`` and ``factor``, against a figure derived from one the table has times a
    documented ratio (shown with its source)."""
    claimed, device, unit = number(claim["claimed_value"]), args["device"], claim["unit"]
    if "derive_from" not in args:
        value, src = ev.spec(device, args["column"])
        if value is None:
            where = _said(args, "where") or message("a benchmark")
            return Verdict(NEEDS["npu"], message("no published {column} for {device} in {source}; measure with {where}",
                                                 column=args["column"], device=device, source=ev.specs_source,
                                                 where=where), "none")
        ok = value > claimed if args.get("op", "=") == ">" else math.isclose(value, claimed, rel_tol=0.05)
        return Verdict("agrees with sources" if ok else "disagrees with sources",
                       message("specs table: {source}; claimed {claimed} {unit}", source=src,
                               claimed=claim["claimed_value"], unit=unit),
                       "documentation", value, ratio=value / claimed if claimed else None)
    base, src = ev.spec(device, args["derive_from"])
    if base is None:
        return Verdict(NEEDS[claim.get("hardware") or "npu"],
                       message("no {column} for {device} in {source} to derive a bound from",
                               column=args["derive_from"], device=device, source=ev.specs_source), "none")
    factor = number(args["factor"])
    derived = base * factor
    how = message("{column} {base:g} x {factor:g} ({factor_source}) = {derived:.3g} {unit}; specs table: {source}",
                  column=args["derive_from"], base=base, factor=factor, factor_source=_said(args, "factor_source"),
                  derived=derived, unit=unit, source=src)
    tol = float(args.get("tolerance", 0.25))
    if claimed > derived * (1 + tol):
        return Verdict("physically impossible", message("claimed {claimed:g} exceeds the derived peak: {how}",
                                                        claimed=claimed, how=how), "bound", ratio=claimed / derived)
    ok = abs(claimed / derived - 1) <= tol
    detail = message("claimed {claimed:g} {unit} is {ratio:.2f}x the derived {how}", claimed=claimed, unit=unit,
                     ratio=claimed / derived, how=how)
    if not ok and args.get("note"):
        detail = message("{detail}; {note}", detail=detail, note=_said(args, "note"))
    return Verdict("agrees with sources" if ok else "disagrees with sources", detail, "bound",
                   ratio=claimed / derived)


def rule_pairing(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A torch_npu / CANN pair against the documented compatibility table (helpers.versions)."""
    npu, cann = args["torch_npu"], args["cann"]
    rows = [r for r in KNOWN_GOOD if r["torch_npu"].startswith(npu)]
    pairs = "; ".join(f"torch_npu {r['torch_npu']} + CANN {r['cann']}" for r in rows) or message("none listed")
    if any(r["cann"].startswith(cann) for r in rows):
        return Verdict("agrees with sources", message("documented pairs for torch_npu {npu}.x: {pairs}", npu=npu,
                                                      pairs=pairs), "documentation")
    other = "; ".join(f"torch_npu {r['torch_npu']}" for r in KNOWN_GOOD if r["cann"].startswith(cann))
    return Verdict("disagrees with sources",
                   message("documented pairs for torch_npu {npu}.x: {pairs}; CANN {cann} pairs with {other} "
                           "(Ascend/pytorch compatibility table)", npu=npu, pairs=pairs, cann=cann,
                           other=other or message("none listed")), "documentation")


def rule_consistency(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """The guide against itself: an expression of its figures, the same figure elsewhere, ms vs tok/s,
    or (``k``) an accuracy threshold against the float16 step at the size of the guide's own outputs.

    Dot products of ``k`` standard-normal pairs have a standard deviation of sqrt(k); float16 keeps 10
    mantissa bits, so neighbouring values there are 2**(floor(log2(sqrt(k))) - 10) apart. Two kernels
    that sum in a different order differ by at least one step somewhere; a threshold below half a step
    passes only bit-identical results.
    """
    claimed = number(claim["claimed_value"])
    tol = float(args.get("tolerance", 0.02))
    if "k" in args:
        k = int(args["k"])
        std = math.sqrt(k)
        step = 2.0 ** (math.floor(math.log2(std)) - int(args.get("mantissa_bits", 10)))
        how = message("outputs of {k}-long dot products of standard-normal values have std {std:.3g}; float16 "
                      "values there are {step:.3g} apart", k=k, std=std, step=step)
        below = claimed < step / 2
        detail = (message("{how}, so a threshold of {claimed:g} is below half a step: only a bit-identical kernel "
                          "meets it with the guide's own inputs", how=how, claimed=claimed) if below
                  else message("{how}: a threshold of {claimed:g} allows for rounding", how=how, claimed=claimed))
        return Verdict("internally inconsistent" if below else "internally consistent", detail, "computed", step,
                       ratio=claimed / step)
    if "expr" in args:
        other = number(args["expr"])
        how = f"{args['expr']} = {other:.3g}"
    elif "rate" in args:
        other = int(args.get("tokens", 100)) / number(args["rate"]) * 1e3
        how = message("{tokens} tokens / {rate} tok/s = {ms:.0f} ms", tokens=args.get("tokens", 100), rate=args["rate"],
                      ms=other)
    else:
        values = [number(v) for v in args["others"].split(",")]
        spread = max(abs(v / claimed - 1) for v in values)
        where = _said(args, "where") or message("elsewhere in the guide")
        return Verdict("internally consistent" if spread <= tol else "internally inconsistent",
                       message("{claimed:.4g} here vs {others} {where} (differ by up to {spread:.1%}, tolerance "
                               "{tol:.0%})", claimed=claimed, others=", ".join(f"{v:.4g}" for v in values),
                               where=where, spread=spread, tol=tol), "guide")
    diff = abs(other / claimed - 1)
    return Verdict("internally consistent" if diff <= tol else "internally inconsistent",
                   message("claimed {claimed:g}; {how} (differs by {diff:.1%}, tolerance {tol:.0%})", claimed=claimed,
                           how=how, diff=diff, tol=tol), "guide", ratio=other / claimed)


def rule_documented(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """Only for claims no measurement or bound can decide: the verdict comes with its source, or,
    for one that nothing measures, ``not measured in this run`` with the ``note`` saying why."""
    if args["verdict"] == NOT_MEASURED:
        return Verdict(NOT_MEASURED, _said(args, "note") or message("no chapter measures this"), "none")
    return Verdict(args["verdict"], _said(args, "source"), "documentation")


def rule_torch_autoload(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """"import torch_npu is required": true before torch 2.5, optional from 2.5 (device-backend autoload).

    Judged on the torch version of the image the guide itself names, not on this machine's.
    """
    image, since = args["image_torch"], args.get("autoload_since", "2.5")
    version = tuple(int(p) for p in re.findall(r"\d+", image)[:2])
    why = message("the guide's image has torch {image}; torch_npu registers a torch.backends entry point that "
                  "'import torch' loads automatically from torch {since} on (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns "
                  "it off)", image=image, since=since)
    if version >= tuple(int(p) for p in since.split(".")):
        return Verdict("disagrees with sources", message("{why}: the explicit import is optional there", why=why),
                       "documentation")
    return Verdict("agrees with sources", message("{why}: torch {image} predates it, so the explicit import is "
                                                  "required on that image (optional on torch >= {since})", why=why,
                                                  image=image, since=since), "documentation")


def rule_npu_ratio(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A speedup that only NPU runtime options produce: read chapter 06's ladder when it ran on an NPU."""
    claimed = number(claim["claimed_value"])
    chapter = "06_optimization_ladder"
    rows = [r for r in ev.rows(chapter, "ladder")
            if r.get("status") == "ok" and r.get("tokens_per_s")]
    step = next((i for i, r in enumerate(rows) if args.get("rung", "runtime") in str(r.get("rung", "")).lower()),
                None)
    if step and device_class(ev.chapter_device(chapter)) == "npu":
        before, row = rows[step - 1], rows[step]
        measured = float(row["tokens_per_s"]) / float(before["tokens_per_s"])
        tol = float(args.get("tolerance", 0.15))  # a step of +34 %: ±25 % would accept no gain at all
        return _judged(claim, ev, chapter, {}, abs(measured / claimed - 1) <= tol,
                       message("ladder step {before} -> {after}: {measured:.2f}x vs claimed {claimed:g}x (±{tol:.0%})",
                               before=before["rung"], after=row["rung"], measured=measured, claimed=claimed, tol=tol),
                       measured, measured / claimed, "")
    return Verdict(NEEDS["npu"], message("run {where}", where=_said(args, "where") or message(
        "chapter 06 on an NPU, where the options exist")), "none")


def _as_fact(value: Any) -> str:
    text = str(value).strip().lower()
    try:
        return f"{number(text):g}"
    except ValueError:
        return text


def rule_fact(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A fact a chapter established and recorded (a library default, whether the guide's code
    runs, what a formula computes): reproduced when the recorded value equals ``want`` (default: the
    claimed value). The chapter ran the experiment; this rule only reads it."""
    entry = ev.entry(args["metric"])
    if entry is None:
        return _not_measured(ev, args["metric"])
    want, got = args.get("want", claim["claimed_value"]), entry["value"]
    ok = _as_fact(got) == _as_fact(want)
    how = entry.get("detail") or entry.get("code_path") or ""
    detail = message("recorded {got!r}, the claim needs {want!r}", got=got, want=want)
    if how:
        detail = message("{detail}: {how}", detail=detail, how=how)
    return _judged(claim, ev, args["metric"].partition(".")[0], entry, ok, detail, got, None,
                   message("holds") if ok else message("does not hold"))


RULES = {
    "api": rule_api, "ratio": rule_measured, "threshold": rule_measured, "fact": rule_fact,
    "bound": rule_bound, "weight_memory": rule_weight_memory, "fits": rule_fits, "spec": rule_spec,
    "pairing": rule_pairing, "consistency": rule_consistency, "documented": rule_documented,
    "npu_ratio": rule_npu_ratio, "torch_autoload": rule_torch_autoload,
    "speedup_every_shape": rule_speedup_every_shape,
}


def judge(claim: dict, ev: Evidence) -> Verdict:
    """One claim's verdict; a rule that crashes is reported as such, never silently dropped."""
    try:
        return RULES[claim["rule"]](claim, parse_args(claim.get("args", "")), ev)
    except Exception as exc:  # noqa: BLE001  (a broken rule must not hide the other claims)
        return Verdict(NOT_MEASURED, message("rule {rule} failed: {error}: {exc}", rule=claim["rule"],
                                             error=type(exc).__name__, exc=str(exc)), "none")


def _rank(v: Verdict, ev: Evidence, target: str) -> tuple:
    """Which run's verdict wins: a measurement on the claimed hardware, then a bound or source, then a
    measurement elsewhere, then "needs ...", then not measured; ties go to the claim's device class,
    then to the order the runs were given."""
    needs = v.verdict in NEEDS.values()
    if v.evidence == "measured" and not v.elsewhere and v.verdict in ("reproduced", "contradicted", "API exists",
                                                                       "API does not exist"):
        rank = 0
    elif not needs and v.verdict != NOT_MEASURED:
        rank = 1
    else:
        rank = 2 if v.elsewhere else 3 if needs else 4
    return rank, 0 if target and ev.device_class == target else 1


def verdicts(run_dirs, claims=None, specs_path=None):
    """The claims table with a verdict per claim, from one run folder or several.

    With several runs (e.g. an NPU run, a CUDA run and a CPU run), each claim takes its verdict from
    the run that can decide it: a 910B claim from an NPU run, an A100 claim from a CUDA run
    (``_rank``). Columns added to the claims table: verdict, verdict_class, detail, evidence,
    measured, measured_on, ratio, decided_by (the run folder whose measurement decided the verdict,
    '' when documentation, specs, a computation or the guide's text did), device_class (of that
    measurement), elsewhere (what the same technique did on a device or model the claim is not
    about; the claim's verdict then stays "needs ...") and elsewhere_run (the run that showed it).
    """
    import pandas as pd

    dirs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    if not dirs:
        raise ValueError("run_dirs is empty; give one run folder or a list of run folders")
    claims = load_claims() if claims is None else claims
    runs = [gather_evidence(d, specs_path) for d in dirs]
    out = []
    for claim in claims.to_dict(orient="records"):
        claim.setdefault("hardware", "")
        claim.setdefault("model", "")
        # min keeps the first of equal ranks: ties go to the order the runs were given
        ev, v = min(((e, judge(claim, e)) for e in runs), key=lambda j: _rank(j[1], j[0], claim["hardware"]))
        decided = v.evidence == "measured" and not v.elsewhere
        # decided_by and device_class only where a measurement decided; elsewhere_run: whose figure ``elsewhere`` shows
        out.append({**claim, **asdict(v), "verdict_class": verdict_class(v.verdict, v.elsewhere),
                    "decided_by": ev.run_name if decided else "", "device_class": v.device_class if decided else "",
                    "elsewhere_run": ev.run_name if v.elsewhere else ""})
    return pd.DataFrame(out)


def verdict_counts(table) -> dict:
    """How many claims fall in each class of ``VERDICT_CLASSES`` (every class, zeros included, in order)."""
    classes = list(table["verdict_class"])
    return {c: classes.count(c) for c in VERDICT_CLASSES}
