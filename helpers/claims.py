"""The guides' checkable claims and the rules that give each one a verdict.

Taught in ``07_report.ipynb``. ``data/guide_claims.csv`` holds every claim with its original Chinese
text, an English gloss, the claimed value and the name of a rule; ``verdicts(run_dir)`` applies
each rule to evidence gathered from that run: every chapter's ``results.json`` (never re-measured),
the device specs table (``data/device_specs.csv``) and chapter
00's API check. The verdict always says what decided it (``evidence``): a measurement of this run,
a physical bound, a computation on this machine, documentation, or the guide's own numbers.
"""
from __future__ import annotations

import ast
import csv
import inspect
import math
import operator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from . import compat
from .results import load_all

DATA = Path(__file__).resolve().parent.parent / "data"
CLAIMS_CSV = DATA / "guide_claims.csv"
SPECS_CSV = DATA / "device_specs.csv"
COLUMNS = ("id", "seed", "section", "text_zh", "gloss_en", "kind", "claimed_value", "unit", "rule", "args")
KINDS = ("api", "performance", "ratio", "fact", "hardware")
REPORT_CHAPTER = "07_report"

VERDICTS = {
    "reproduced": "measured in this run and within the stated tolerance of the claim",
    "contradicted": "a measurement, computation or documentation of this run disagrees",
    "physically impossible": "beyond what the hardware can do even at its peak (the bound is shown)",
    "API does not exist": "no such name in any torch_npu / library release checked (the real one is shown)",
    "API exists": "the name exists (live check where possible, else documented)",
    "internally inconsistent": "the guide's own numbers or steps disagree with each other",
    "internally consistent": "the guide's own numbers agree with each other (not a measurement)",
    "agrees with sources": "matches documentation or the specs table (not measured here)",
    "needs an NPU to check": "within every bound; only an Ascend NPU run can measure it",
    "needs other hardware to check": "within every bound; needs the named non-Ascend device",
    "not measured in this run": "the chapter that measures it did not run, failed, or skipped it",
}

# Released parameter counts, used for weight-bound rules (no hub download needed).
MODEL_PARAMS = {"llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192}
BYTES_PER_PARAM = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1}


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


def number(text: "str | float | int") -> float:
    """A claimed number: ``"16.5"``, ``">1000"``, or arithmetic on the guide's figures (``"29.3/16.5"``)."""
    if isinstance(text, (int, float)):
        return float(text)
    text = str(text).strip().lstrip("<>=~").strip()

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"{text!r} is not a number or arithmetic on numbers")

    return ev(ast.parse(text, mode="eval"))


def claimed_range(text: str) -> tuple[float, float]:
    """``"0.05-0.1"`` -> (0.05, 0.1); a single value gives (v, v)."""
    text = str(text).strip()
    if "-" in text[1:] and "/" not in text and "*" not in text:
        low, high = text.split("-", 1) if not text.startswith("-") else (text, text)
        return number(low), number(high)
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
        for col in ("text_zh", "gloss_en", "claimed_value", "seed"):
            if not row[col].strip():
                raise ValueError(f"{where}: empty {col}")
        parse_args(row["args"])
    return pd.DataFrame(rows, columns=list(COLUMNS))


# --- evidence ---------------------------------------------------------------------------------

# Column names other tables use for the same quantity (the first name is the one used here).
SPEC_ALIASES = {
    "hbm_bandwidth_gbps": ("hbm_bandwidth_gbps", "bandwidth_gbps", "memory_bandwidth_gbps"),
    "fp16_tflops": ("fp16_tflops", "fp16_dense_tflops"),
    "int8_tops": ("int8_tops", "int8_dense_tops"),
    "memory_gb": ("memory_gb", "hbm_gb"),
    "confidence": ("confidence", "status"),
}
NUMERIC_SPECS = ("hbm_bandwidth_gbps", "fp16_tflops", "int8_tops", "memory_gb")


def _normalise_spec(raw: dict) -> Optional[dict]:
    row = {str(k).strip(): (v.strip() if isinstance(v, str) else v) for k, v in raw.items() if k}
    if not row.get("device"):
        return None
    if row.get("variant"):  # e.g. device "Ascend 910B", variant "910B4 (Atlas 800I A2 32GB)"
        row["device"] = f"{row['device']} {row['variant']}"
    for name, aliases in SPEC_ALIASES.items():
        row[name] = next((row[a] for a in aliases if row.get(a) not in (None, "")), None)
    for name in NUMERIC_SPECS:
        try:
            row[name] = float(row[name]) if row[name] is not None else None
        except (TypeError, ValueError):
            row[name] = None
    return row


def load_specs(path: "str | Path | None" = None) -> tuple[list[dict], str]:
    """Rows of the device specs table (``data/device_specs.csv``) and where they came from.

    A missing or unreadable table gives no rows: the bound rules then say which figure is missing
    instead of using numbers from anywhere else.
    """
    path = Path(path) if path else SPECS_CSV
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = [r for r in map(_normalise_spec, csv.DictReader(fh)) if r is not None]
    except (OSError, csv.Error, UnicodeDecodeError):
        rows = []
    if not rows:
        return [], f"{path.name} (not found or empty: no device specs)"
    return [{**r, "table": "csv"} for r in rows], path.name


@dataclass
class Evidence:
    """What a verdict may use: results of every chapter, specs, chapter 00's API table."""

    results: dict = field(default_factory=dict)
    specs: list = field(default_factory=list)
    specs_source: str = ""
    api_rows: list = field(default_factory=list)
    api_source: str = ""
    run_dir: str = ""

    def entry(self, dotted: str) -> Optional[dict]:
        """``"04_batching.batch_throughput_ratio_4"`` -> the metric entry, if the chapter recorded it."""
        chapter, _, key = dotted.partition(".")
        data = self.results.get(chapter)
        if not data:
            return None
        entry = data.get("metrics", {}).get(key)
        if entry is None or entry.get("value") is None:
            return None
        return entry

    def chapter_state(self, chapter: str) -> str:
        data = self.results.get(chapter)
        if not data:
            return "did not run"
        status = data.get("status", "?")
        if status == "running":
            return "did not finish (failed or interrupted)"
        return status

    def spec(self, device: str, column: str) -> tuple[Optional[float], str]:
        """The most generous value among rows whose device name contains ``device``."""
        matches = [r for r in self.specs if r.get(column) is not None
                   and device.lower() in str(r.get("device", "")).lower()]
        if not matches:
            return None, ""
        best = max(matches, key=lambda r: r[column])
        return float(best[column]), (f"{best['device']}: {best[column]:g} ({best.get('source', '')}; "
                                     f"{best.get('confidence') or '?'}; from {self.specs_source})")


def gather_evidence(run_dir: "str | Path", specs_path=None) -> Evidence:
    """Read a run folder (never re-measure): every chapter but this report, specs, API table."""
    results = {k: v for k, v in load_all(run_dir).items() if k != REPORT_CHAPTER}
    specs, specs_source = load_specs(specs_path)
    api_rows = (results.get("00_environment_check") or {}).get("tables", {}).get("api_check")
    if api_rows:
        api_source = "chapter 00 api_check table of this run"
    else:
        api_rows = compat.api_check(None)
        api_source = "helpers.compat.API_CLAIMS (documented; chapter 00 did not run)"
    return Evidence(results, specs, specs_source, list(api_rows), api_source, str(run_dir))


# --- rules ------------------------------------------------------------------------------------

@dataclass
class Verdict:
    verdict: str
    detail: str
    evidence: str  # measured / bound / computed / documentation / guide
    measured: Any = None
    measured_on: str = ""
    ratio: Optional[float] = None  # measured / claimed

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")


def _context(entry: dict) -> str:
    return ", ".join(f"{entry[k]}" for k in ("device", "dtype", "shape", "code_path") if entry.get(k))


def _not_measured(ev: Evidence, dotted: str, where: str = "") -> Verdict:
    chapter = dotted.partition(".")[0]
    state = ev.chapter_state(chapter)
    why = f"{chapter} {state}" if state not in ("ok", "skipped") else \
        f"{chapter} ({state}) did not record {dotted.partition('.')[2]}"
    reason = ev.results.get(chapter, {}).get("status_reason")
    return Verdict("not measured in this run", why + (f": {reason}" if reason else "")
                   + (f"; run {where}" if where else ""), "none")


def rule_api(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A guide API name, judged by chapter 00's table (live hasattr where torch_npu imports)."""
    name = args["name"]
    source = ev.api_source
    row = next((r for r in ev.api_rows if r.get("guide_name") == name), None)
    if row is None:  # an older chapter 00 table without this name: the documented row still decides
        row = next((r for r in compat.api_check(None) if r["guide_name"] == name), None)
        source = "helpers.compat.API_CLAIMS (documented)"
    if row is None:
        return Verdict("not measured in this run", f"{name} is in no API table ({ev.api_source})", "none")
    live = row.get("exists_here")
    documented = str(row.get("documented", ""))
    real = row.get("real_api", "")
    if live is True:
        return Verdict("API exists", f"hasattr check on this machine found {name}; documented: {documented}",
                       "measured", True)
    if live is False:
        return Verdict("API does not exist", f"hasattr check on this machine: missing. Real API: {real}",
                       "measured", False)
    if documented.lower().startswith("does not exist") or documented.lower().startswith("no "):
        return Verdict("API does not exist", f"{documented}. Real API: {real} (source: {source})",
                       "documentation")
    return Verdict("API exists", f"{documented}; real form: {real} (source: {source}; live check "
                                 "needs torch_npu)", "documentation")


def rule_python_api(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A name in an installed Python package, checked by import and signature on this machine."""
    import importlib

    module_name, _, attr = args["name"].rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        return Verdict("API does not exist", f"{args['name']}: {exc}", "computed")
    wanted = [p for p in args.get("params", "").split(",") if p]
    params = set(inspect.signature(obj).parameters)
    missing = [p for p in wanted if p not in params]
    if missing:
        return Verdict("API does not exist", f"{args['name']} has no parameter(s) {missing}", "computed")
    return Verdict("API exists", f"{args['name']} imports here and takes {', '.join(wanted) or 'its arguments'}",
                   "computed", True)


def rule_ratio(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A claimed ratio against a measured one: relative ``tolerance`` or absolute ``abs_tol``."""
    claimed = number(claim["claimed_value"])
    entry = ev.entry(args["metric"])
    note = f" ({args['note']})" if args.get("note") else ""
    if entry is None:
        v = _not_measured(ev, args["metric"])
        v.detail += note
        return v
    measured = float(entry["value"])
    on = _context(entry)
    if "abs_tol" in args:
        tol = float(args["abs_tol"])
        ok = abs(measured - claimed) <= tol
        rule_text = f"|measured - claimed| = {abs(measured - claimed):.3g} vs tolerance {tol:g}"
    else:
        tol = float(args.get("tolerance", 0.25))
        ok = claimed != 0 and abs(measured / claimed - 1) <= tol
        rule_text = f"measured/claimed = {measured / claimed:.2f} (tolerance ±{tol:.0%})"
    ratio = measured / claimed if claimed else None
    detail = f"measured {measured:.3g}{claim['unit'] and ' ' + claim['unit']} vs claimed {claimed:.3g}: " \
             f"{rule_text}; on {entry.get('device', '?')}{note}"
    return Verdict("reproduced" if ok else "contradicted", detail, "measured", measured, on, ratio)


def rule_at_least(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A claimed minimum ratio: reproduced when measured >= claimed * (1 - tolerance)."""
    claimed = number(claim["claimed_value"])
    entry = ev.entry(args["metric"])
    if entry is None:
        return _not_measured(ev, args["metric"])
    measured = float(entry["value"])
    tol = float(args.get("tolerance", 0.0))
    ok = measured >= claimed * (1 - tol)
    return Verdict("reproduced" if ok else "contradicted",
                   f"measured {measured:.3g} vs claimed at least {claimed:.3g} (tolerance {tol:.0%}); "
                   f"on {entry.get('device', '?')}", "measured", measured, _context(entry),
                   measured / claimed if claimed else None)


_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def rule_threshold(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """``measured <op> claimed`` (e.g. a max-abs difference below 1e-3, a speedup above 1)."""
    claimed = number(claim["claimed_value"])
    op = args.get("op", "<")
    if op not in _CMP:
        raise ValueError(f"claim {claim['id']}: op={op!r}; choose one of {', '.join(_CMP)}")
    entry = ev.entry(args["metric"])
    if entry is None:
        return _not_measured(ev, args["metric"])
    measured = float(entry["value"])
    ok = _CMP[op](measured, claimed)
    return Verdict("reproduced" if ok else "contradicted",
                   f"measured {measured:.3g} {op if ok else 'is not ' + op} {claimed:g}; on "
                   f"{_context(entry) or '?'}", "measured", measured, _context(entry))


def weight_bytes(model: str = "llama2-7b", dtype: str = "float16") -> int:
    """Weight bytes of a released Llama-2 model in ``dtype`` (all parameters; int8 counts 1 byte each)."""
    if model == "llama2-7b" and dtype in ("float16", "bfloat16"):
        try:  # chapter 03/04's helper, when merged, is the one source of this number
            from .roofline import llama2_7b_weight_bytes

            return int(llama2_7b_weight_bytes(dtype))
        except Exception:
            pass
    if model not in MODEL_PARAMS or dtype not in BYTES_PER_PARAM:
        raise ValueError(f"model={model!r}/dtype={dtype!r}; choose from {list(MODEL_PARAMS)} / "
                         f"{list(BYTES_PER_PARAM)}")
    return MODEL_PARAMS[model] * BYTES_PER_PARAM[dtype]


def _npu_measurement(ev: Evidence, dotted: Optional[str], want: str, context: str = "") -> Optional[dict]:
    """The metric when it was measured on the claim's kind of device (and, if asked, in its setting)."""
    if not dotted:
        return None
    entry = ev.entry(dotted)
    if not entry or not str(entry.get("device", "")).startswith(want):
        return None
    if context and context not in str(entry.get("context", "")):
        return None  # e.g. measured at the profile's shape, not the guide's
    return entry


def rule_bound(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """Latency (ms) or decode rate (tok/s) against the device's bandwidth and compute bounds.

    The fastest any implementation can be is max(bytes / bandwidth, flops / peak), over ``devices``
    chips at their (generous) spec. A claim faster than that is physically impossible; otherwise an
    NPU measurement of this run decides it, or it waits for one.
    """
    device = args["device"]
    n = int(args.get("devices", 1))
    bw, bw_src = ev.spec(device, "hbm_bandwidth_gbps")
    flops, fl_src = ev.spec(device, "fp16_tflops")
    if "bytes" in args:
        nbytes = number(args["bytes"])
    else:
        nbytes = float(weight_bytes("llama2-7b", args.get("weights", "float16")))
    prompt = int(args.get("prompt_tokens", 0))
    work = 2 * MODEL_PARAMS["llama2-7b"] * prompt if prompt else 0.0
    low, high = claimed_range(claim["claimed_value"])
    unit = claim["unit"]
    if unit == "tok/s":  # the most lenient end: the slowest claimed rate
        claimed_s, shown = 1.0 / low, f"{low:g} tok/s = {1e3 / low:.3g} ms per token"
    elif unit == "ms":  # the most lenient end: the longest claimed time
        claimed_s, shown = high / 1e3, f"{high:g} ms"
    else:
        raise ValueError(f"claim {claim['id']}: rule bound needs unit tok/s or ms, not {unit!r}")
    if bw is None:
        return Verdict("needs an NPU to check" if "910" in device else "needs other hardware to check",
                       f"no bandwidth for {device} in {ev.specs_source}", "none")
    t_mem = nbytes / (bw * 1e9 * n)
    t_cmp = work / (flops * 1e12 * n) if (work and flops) else 0.0
    bound = max(t_mem, t_cmp)
    how = (f"{nbytes / 1e9:.3g} GB / ({n} x {bw:g} GB/s) = {t_mem * 1e3:.3g} ms"
           + (f"; {work / 1e9:.3g} GFLOP / ({n} x {flops:g} TFLOPS) = {t_cmp * 1e3:.3g} ms" if t_cmp else ""))
    source = f"spec {bw_src}" + (f"; {fl_src}" if t_cmp else "")
    if claimed_s < bound:
        need = nbytes / claimed_s / 1e12
        return Verdict("physically impossible",
                       f"claimed {shown}, but the floor is {how} (it would need {need:.3g} TB/s); {source}",
                       "bound", ratio=bound / claimed_s)
    want = "npu" if "910" in device else "cuda"
    entry = _npu_measurement(ev, args.get("metric"), want, args.get("context", ""))
    if entry is not None:
        measured = float(entry["value"])
        ok = low * 0.75 <= measured <= high * 1.25  # the guides give no tolerance; ±25 % of the range
        return Verdict("reproduced" if ok else "contradicted",
                       f"measured {measured:.3g} {unit} vs claimed {claim['claimed_value']} {unit} (±25%)",
                       "measured", measured, _context(entry), measured / ((low + high) / 2))
    verdict = "needs an NPU to check" if want == "npu" else "needs other hardware to check"
    return Verdict(verdict, f"within the bound (floor {how}; claimed {shown}); run "
                            f"{args.get('where', 'the matching chapter on that device')}", "bound",
                   ratio=bound / claimed_s)


def rule_weight_memory(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A memory/storage figure (GB) against the weights it must hold, in GB and GiB readings."""
    claimed = number(claim["claimed_value"])
    weights = weight_bytes("llama2-7b", args.get("weights", "float16"))
    as_gb, as_gib = claimed * 1e9, claimed * 2**30
    text = f"Llama-2-7B {args.get('weights', 'float16')} weights are {weights / 1e9:.2f} GB " \
           f"({weights / 2**30:.2f} GiB)"
    if max(as_gb, as_gib) < weights:
        return Verdict("physically impossible", f"claimed {claimed:g} GB holds less than the weights: {text}",
                       "bound", ratio=claimed * 1e9 / weights)
    if args.get("mode") == "storage":
        return Verdict("agrees with sources", f"{claimed:g} GB holds the weights ({text}) with room for a "
                                              "second copy in another format", "bound",
                       ratio=claimed * 1e9 / weights)
    verdict = "needs an NPU to check" if "910" in args.get("device", "910") else "needs other hardware to check"
    note = " (only under a GiB reading of the unit)" if as_gb < weights else ""
    return Verdict(verdict, f"claimed {claimed:g} GB covers the weights{note}: {text}; peak memory needs a "
                            "run on that device", "bound", ratio=claimed * 1e9 / weights)


def rule_fits(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """Does the model's weights fit one device? (the guide says it needs model parallelism)."""
    weights = weight_bytes(args["model"], args.get("weights", "float16"))
    mem, src = ev.spec(args["device"], "memory_gb")
    if mem is None:
        return Verdict("not measured in this run", f"no memory size for {args['device']}", "none")
    fits = weights < mem * 1e9
    detail = (f"{args['model']} {args.get('weights', 'float16')} weights are {weights / 1e9:.1f} GB; one "
              f"{src.split(':')[0]} has {mem:g} GB")
    if fits:
        return Verdict("contradicted", detail + ": it fits on one card (tensor parallelism is needed on "
                                                "32 GB cards, and for 70B)", "bound", ratio=weights / (mem * 1e9))
    return Verdict("agrees with sources", detail + ": it does not fit on one card", "bound",
                   ratio=weights / (mem * 1e9))


def rule_spec(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A hardware figure against the specs table (the table's source and confidence are shown)."""
    value, src = ev.spec(args["device"], args["column"])
    claimed = number(claim["claimed_value"])
    if value is None:
        return Verdict("needs an NPU to check", f"no published {args['column']} for {args['device']} in "
                                                f"{ev.specs_source}; measure with {args.get('where', 'a benchmark')}",
                       "none")
    op = args.get("op", "=")
    ok = value > claimed if op == ">" else math.isclose(value, claimed, rel_tol=0.05)
    return Verdict("agrees with sources" if ok else "contradicted",
                   f"specs table: {src}; claimed {claim['claimed_value']} {claim['unit']}", "documentation",
                   value, ratio=value / claimed if claimed else None)


def rule_pairing(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A torch_npu / CANN pair against the documented compatibility table (helpers.compat)."""
    npu, cann = args["torch_npu"], args["cann"]
    rows = [r for r in compat.KNOWN_GOOD if r["torch_npu"].startswith(npu)]
    cann_rows = [r for r in compat.KNOWN_GOOD if r["cann"].startswith(cann)]
    pairs = "; ".join(f"torch_npu {r['torch_npu']} + CANN {r['cann']}" for r in rows) or "none listed"
    if any(r["cann"].startswith(cann) for r in rows):
        return Verdict("agrees with sources", f"documented pairs for torch_npu {npu}.x: {pairs}", "documentation")
    other = "; ".join(f"torch_npu {r['torch_npu']}" for r in cann_rows) or "none listed"
    return Verdict("contradicted", f"documented pairs for torch_npu {npu}.x: {pairs}; CANN {cann} pairs with "
                                   f"{other} (Ascend/pytorch compatibility table)", "documentation")


def rule_consistency(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """The guide against itself: an expression of its figures, the same figure elsewhere, or ms vs tok/s."""
    claimed = number(claim["claimed_value"])
    tol = float(args.get("tolerance", 0.02))
    if "expr" in args:
        other = number(args["expr"])
        how = f"{args['expr']} = {other:.3g}"
    elif "rate" in args:
        other = int(args.get("tokens", 100)) / number(args["rate"]) * 1e3
        how = f"{args.get('tokens', 100)} tokens / {args['rate']} tok/s = {other:.0f} ms"
    else:
        values = [number(v) for v in args["others"].split(",")]
        spread = max(abs(v / claimed - 1) for v in values)
        ok = spread <= tol
        return Verdict("internally consistent" if ok else "internally inconsistent",
                       f"{claimed:g} here vs {', '.join(f'{v:g}' for v in values)} elsewhere in the guide "
                       f"(differ by up to {spread:.1%}, tolerance {tol:.0%})", "guide")
    diff = abs(other / claimed - 1)
    return Verdict("internally consistent" if diff <= tol else "internally inconsistent",
                   f"claimed {claimed:g}; {how} (differs by {diff:.1%}, tolerance {tol:.0%})", "guide",
                   ratio=other / claimed)


def rule_documented(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """Only for claims no measurement or bound can decide: the verdict comes with its source."""
    return Verdict(args["verdict"], args["source"], "documentation")


def rule_unmeasured(claim: dict, args: dict, ev: Evidence) -> Verdict:
    return Verdict("not measured in this run", args.get("note", "no chapter measures this"), "none")


def rule_npu_ratio(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A speedup that only NPU runtime options produce: read chapter 06's ladder when it ran on an NPU."""
    claimed = number(claim["claimed_value"])
    data = ev.results.get("06_optimization_ladder") or {}
    rows = data.get("tables", {}).get("ladder") or []
    device = str(data.get("environment", {}).get("device", ""))
    row = next((r for r in rows if "runtime" in str(r.get("rung", "")).lower() and r.get("status") == "ok"), None)
    if row is not None and device.startswith("npu") and row.get("speedup"):
        measured = float(row["speedup"])
        ok = abs(measured / claimed - 1) <= 0.25
        return Verdict("reproduced" if ok else "contradicted",
                       f"ladder rung {row['rung']}: {measured:.2f}x vs claimed {claimed:g}x (±25%)",
                       "measured", measured, device, measured / claimed)
    return Verdict("needs an NPU to check", f"run {args.get('where', 'chapter 06 on an NPU')}", "none")


def rule_llama_rmsnorm(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """transformers' LlamaRMSNorm against the guide's formula, computed here on a small tensor."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64) + 0.5)
        x = torch.randn(3, 64)
        guide = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-5) * norm.weight
        diff = (norm(x) - guide).abs().max().item()
    has_bias = any("bias" in n for n, _ in norm.named_parameters())
    ok = diff < 1e-5 and not has_bias
    return Verdict("reproduced" if ok else "contradicted",
                   f"LlamaRMSNorm vs the formula: max abs diff {diff:.2e} (float32), bias parameter: "
                   f"{'yes' if has_bias else 'none'}", "computed", diff)


def rule_llama2_config(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """A Llama-2-7B shape against transformers' LlamaConfig defaults (which are Llama-2-7B's)."""
    from transformers import LlamaConfig

    key = args["key"]
    real = getattr(LlamaConfig(), key)
    claimed = number(claim["claimed_value"])
    ok = real == claimed
    return Verdict("reproduced" if ok else "contradicted",
                   f"LlamaConfig().{key} = {real} (Llama-2-7B); {claimed:g} is "
                   + ("the same" if ok else "Llama-3-8B's / Mistral-7B's value"), "computed", real)


def rule_shape_check(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """Run the guide's call on meta tensors (no memory, no time) to see if its shapes work."""
    import torch

    x_shape = [int(v) for v in args["x"].split(",")]
    w_shape = [int(v) for v in args["weight"].split(",")]
    x = torch.empty(x_shape, device="meta")
    w = torch.empty(w_shape, device="meta")
    try:
        out = torch.nn.functional.linear(x, w)
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0]
        return Verdict("contradicted", f"F.linear(x{x_shape}, w{w_shape}) raises: {msg}. nn.Linear weights are "
                                       "[out, in]: w_gate must be [14336, 4096] (or use x @ w_gate)",
                       "computed")
    return Verdict("reproduced", f"F.linear gives shape {list(out.shape)}", "computed", list(out.shape))


def rule_compile_generate(claim: dict, args: dict, ev: Evidence) -> Verdict:
    """Does ``torch.compile(model).generate`` run the compiled forward? Checked on a tiny module."""
    import torch

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return x

        def generate(self):
            return self  # transformers' generate calls self(...) on this object

    compiled = torch.compile(Tiny())
    target = compiled.generate()
    if target is compiled:
        return Verdict("reproduced", "generate runs on the compiled wrapper", "computed")
    return Verdict("contradicted", "torch.compile returns an OptimizedModule whose .generate is the original "
                                   "module's method: generate's forward calls run eager. Compile the forward "
                                   "instead (model.forward = torch.compile(model.forward), or "
                                   "model.compile()), as chapter 03 does", "computed")


RULES: dict[str, Callable[[dict, dict, Evidence], Verdict]] = {
    "api": rule_api, "python_api": rule_python_api, "ratio": rule_ratio, "at_least": rule_at_least,
    "threshold": rule_threshold, "bound": rule_bound, "weight_memory": rule_weight_memory,
    "fits": rule_fits, "spec": rule_spec, "pairing": rule_pairing, "consistency": rule_consistency,
    "documented": rule_documented, "unmeasured": rule_unmeasured, "npu_ratio": rule_npu_ratio,
    "llama_rmsnorm": rule_llama_rmsnorm, "llama2_config": rule_llama2_config,
    "shape_check": rule_shape_check, "compile_generate": rule_compile_generate,
}


def judge(claim: dict, ev: Evidence) -> Verdict:
    """One claim's verdict; a rule that crashes is reported as such, never silently dropped."""
    try:
        return RULES[claim["rule"]](claim, parse_args(claim.get("args", "")), ev)
    except Exception as exc:  # noqa: BLE001  (a broken rule must not hide the other claims)
        return Verdict("not measured in this run", f"rule {claim['rule']} failed: {type(exc).__name__}: {exc}",
                       "none")


def verdicts(run_dir: "str | Path", claims=None, specs_path=None):
    """The claims table with verdict, detail, evidence, measured value and ratio columns."""
    import pandas as pd

    claims = load_claims() if claims is None else claims
    ev = gather_evidence(run_dir, specs_path)
    out = []
    for claim in claims.to_dict(orient="records"):
        out.append({**claim, **asdict(judge(claim, ev))})
    return pd.DataFrame(out)


def verdict_counts(table) -> dict[str, int]:
    """How many claims got each verdict, in the order of ``VERDICTS``."""
    counts = table["verdict"].value_counts().to_dict()
    return {v: int(counts.get(v, 0)) for v in VERDICTS if counts.get(v, 0)}
