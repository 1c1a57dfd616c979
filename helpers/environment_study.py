"""Chapter 00's own study (layer: chapter studies; taught in 00_environment_check): the tables that
chapter shows of the device, the dtype choice and the torch_npu line, built from the layers below."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

import torch

from . import ge_support, ops, versions
from .prose import Message, N_, message

# The words of this chapter's tables (column names, categories in cells): ``prose.show`` translates
# them on the page through the runtime catalog; the recorded tables keep the English.
TABLE_WORDS = (
    N_("fact"), N_("device name"), N_("device count"), N_("host RAM (GiB)"), N_("device memory (GiB)"),
    N_("torch threads"), N_("workbook commit"), N_("not found"), N_("not used"), N_("request_ms"),
    N_("request_p10_ms"), N_("request_p90_ms"), N_("request_prompt_tokens"), N_("request_new_tokens"),
    N_("decode_context_tokens"), N_("prefill_short_tokens"), N_("prefill_short_ms"),
    N_("prefill_short_p10_ms"), N_("prefill_short_p90_ms"), N_("prefill_long_tokens"), N_("prefill_long_ms"),
    N_("prefill_long_p10_ms"), N_("prefill_long_p90_ms"), N_("timed_layers"), N_("request_time_ratio"),
    N_("request_ratio_low"), N_("request_ratio_high"), N_("decode_time_ratio"), N_("decode_ratio_low"),
    N_("decode_ratio_high"), N_("prefill_long_time_ratio"), N_("prefill_long_ratio_low"),
    N_("prefill_long_ratio_high"), N_("cann"), N_("guide_name"), N_("real_api"), N_("documented"),
    N_("exists_here"), N_("op"), N_("available_here"), N_("feature"), N_("available"), N_("present"),
    N_("used for"), N_("without it"), N_("class"), N_("attention_heads"), N_("kv_heads"), N_("vocab_size"),
    N_("tied_embeddings"), N_("parameters"), N_("weight_bytes"), N_("HF_ENDPOINT set"), N_("endpoint used"),
    N_("before importing"), N_("after importing"), N_("sum (read)"), N_("copy (read+write)"),
)

# --- the device and the dtype choice (from backend and dtype_choice) -----------------------------

def environment_table(report: dict):
    """An ``environment_report`` as a two-column table (``fact``, ``value``), the way chapter 00
    shows it: a reader sees what is installed and what is missing without reading a dict. The
    memory row says whose memory it is (host RAM on a CPU, the device's own on an NPU / GPU)."""
    import pandas as pd

    props = report.get("device_properties") or {}
    on_cpu = str(report.get("device", "cpu")).startswith("cpu")
    memory = props.get("total_memory_bytes")
    rows = [("python", report.get("python")), ("torch", report.get("torch")),
            ("transformers", report.get("transformers")),
            ("torch_npu", report.get("torch_npu") or message("not loaded ({error})", error=report.get("torch_npu_error"))),
            ("CANN", report.get("cann") or "not found"), ("CUDA", report.get("cuda") or "not used"),
            ("device", report.get("device")), ("device name", props.get("name")),
            ("device count", props.get("count")),
            ("host RAM (GiB)" if on_cpu else "device memory (GiB)",
             round(memory / 2**30, 1) if memory else None),
            ("CPU", report.get("cpu_model")), ("torch threads", report.get("torch_threads")),
            ("workbook commit", report.get("workbook_commit"))]
    return pd.DataFrame([(f, v if isinstance(v, Message) else str(v)) for f, v in rows], columns=["fact", "value"])


def dtype_probe_table(rows: list[dict], baseline: str = "float32"):
    """``dtype_choice.choose_dtype``'s timed rows with each dtype's request, decode-step and
    long-prefill times as ratios of ``baseline``'s, with the conservative spread of
    ``bench.speedup``: ``(candidate p10 / baseline p90, candidate p90 / baseline p10)``. The
    request's spread lies wholly below 1 exactly when ``dtype_choice.faster_beyond_spread`` holds,
    so ``decide.time_ratio_direction`` on it says what the choice saw. A row with a ``problem`` (a
    dtype that does not run correctly here) keeps it and no times. ``n_samples`` is the count of
    each ratio: the fewer of the row's and ``baseline``'s own ``n_samples``."""
    import pandas as pd

    columns = ["dtype", "request_ms", "request_p10_ms", "request_p90_ms", "request_prompt_tokens",
               "request_new_tokens", "decode_ms", "decode_p10_ms", "decode_p90_ms", "decode_context_tokens",
               "prefill_short_tokens", "prefill_short_ms", "prefill_short_p10_ms", "prefill_short_p90_ms",
               "prefill_long_tokens", "prefill_long_ms", "prefill_long_p10_ms", "prefill_long_p90_ms",
               "timed_layers", "layers", "problem"]
    table = pd.DataFrame(rows, columns=columns)  # a row without times (a problem) gets NaN ratios
    base = next((r for r in rows if r["dtype"] == baseline), None)
    if base is not None:
        # a ratio stands on the fewer samples of its two sides (None: a side did not record its count),
        # so the page's direction word is said only from as many samples as decide asks for
        def count(row):
            n = row.get("n_samples")
            return n if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0 else None

        base_count = count(base)
        table["n_samples"] = pd.Series([None if count(r) is None or base_count is None or r.get("problem")
                                        else min(count(r), base_count) for r in rows], dtype=object)
        for phase in ("request", "decode", "prefill_long"):
            table[f"{phase}_time_ratio"] = table[f"{phase}_ms"] / base[f"{phase}_ms"]
            table[f"{phase}_ratio_low"] = table[f"{phase}_p10_ms"] / base[f"{phase}_p90_ms"]
            table[f"{phase}_ratio_high"] = table[f"{phase}_p90_ms"] / base[f"{phase}_p10_ms"]
    return table


def hub_endpoint_seen(variable: str = "HF_ENDPOINT", value: str = "https://hf-mirror.com") -> dict:
    """Which endpoint huggingface_hub uses when ``variable`` is set before / after importing it.

    Each case runs in a fresh interpreter (huggingface_hub reads its settings once, at import), so
    the notebook's own environment is never changed. Chapter 00 records the result.
    """
    setting, hub = f"os.environ[{variable!r}] = {value!r}", "import huggingface_hub.constants as c"
    env = {k: v for k, v in os.environ.items() if k != variable}
    seen = {}
    for when, first, second in (("before", setting, hub), ("after", hub, setting)):
        code = f"import os; {first}; {second}; print(c.ENDPOINT)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"huggingface_hub probe failed: {out.stderr.strip().splitlines()[-1:]}")
        seen[when] = out.stdout.strip()
    return {"before_import": seen["before"], "after_import": seen["after"],
            "read_before_import": seen["before"] == value.rstrip("/")}


# --- what this torch and torch_npu have: the real fused ops, the torch features helpers rely on ------

_REAL_NPU_OPS = ("npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_ffn",
                 "npu_weight_quant_batchmatmul", "npu_quant_matmul", "npu_dynamic_quant",
                 "npu_fusion_attention", "npu_incre_flash_attention", "npu_prompt_flash_attention",
                 "npu_fused_infer_attention_score", "npu_layer_norm_eval")


def real_ops_check(torch_npu_module=None) -> list[dict]:
    """The real fused ops, by their real names, with availability on this machine."""
    return [{"op": f"torch_npu.{op}",
             "available_here": None if torch_npu_module is None else hasattr(torch_npu_module, op)}
            for op in _REAL_NPU_OPS]


def feature_table() -> dict[str, bool]:
    return {name: versions.has_feature(name) for name in versions.FEATURES}


# --- the torch_npu line and its graph modes (from versions and ge_support) ----------------------

def pairing_check(torch_version: str, torch_npu_version: Optional[str],
                  cann: Optional[str] = None) -> dict:
    """Does this torch_npu pair with this torch (and CANN)? Returns verdict + advice."""
    if not torch_npu_version:
        return {"ok": None, "verdict": message("torch_npu not installed: nothing to pair"), "advice": ""}
    t, n = versions.version_tuple(torch_version), versions.version_tuple(torch_npu_version)
    if t != n:
        want = versions.dotted(n)
        known = [r["torch_npu"] for r in versions.KNOWN_GOOD if versions.version_tuple(r["torch"]) == t]
        other = (f"torch_npu {known[-1]} (known-good for torch {versions.dotted(t)})" if known
                 else f"a torch_npu {versions.dotted(t)}.x build")
        return {
            "ok": False,
            "verdict": f"torch {torch_version} does not pair with torch_npu {torch_npu_version}",
            "advice": f"torch_npu {torch_npu_version} needs torch {want}: "
                      f"pip install torch=={want} (CPU wheel), or install {other} to match "
                      f"torch {torch_version}",
            "matching_torch": want,
            "matching_torch_npu": known[-1] if known else None,
        }
    row = next((r for r in versions.KNOWN_GOOD if r["torch_npu"] == torch_npu_version), None)
    if row is None:
        return {"ok": True, "verdict": f"torch and torch_npu versions pair ({torch_version})",
                "advice": "this torch_npu build is not in the known-good table; check "
                          "Ascend/pytorch COMPATIBILITY for its CANN version"}
    if cann and versions.version_tuple(cann)[:2] != versions.version_tuple(row["cann"])[:2]:
        return {"ok": True, "verdict": f"torch/torch_npu pair; CANN {cann} differs from the "
                                       f"documented {row['cann']}",
                "advice": f"torch_npu {torch_npu_version} is documented with CANN {row['cann']}"}
    return {"ok": True, "verdict": f"known-good: torch {row['torch']} + torch_npu "
                                   f"{row['torch_npu']} + CANN {row['cann']}", "advice": ""}


# Each GE probe's row (ge_support.GE_PROBE_OPS): what the op inside a GE graph is for, and what runs
# without it.
_GE_ROWS = {
    "npu_rms_norm": ("npu_rms_norm inside a GE graph (graph mode after the fused-operators rung)",
                     "the reference RMSNorm runs"),
    "npu_add_rms_norm": ("npu_add_rms_norm inside a GE graph", "the reference add + RMSNorm runs"),
    "npu_swiglu": ("npu_swiglu inside a GE graph (graph mode after the fused-operators rung)",
                   "the reference SwiGLU runs"),
    "npu_weight_quant_batchmatmul": ("W8A16 Int8Linear inside a GE graph (the INT8 rung in graph mode)",
                                     "the dequant INT8 kernel runs"),
    "npu_dynamic_quant": ("dynamic W8A8 inside a GE graph: npu_dynamic_quant + npu_quant_matmul (chapter 05)",
                          "W8A8 runs emulated"),
    "npu_quant_matmul": ("static W8A8 inside a GE graph: npu_quant_matmul with the int64 scale of "
                         "npu_trans_quant_param (chapter 05)", "W8A8 runs emulated"),
}


def _line_row(feature: str, present: Optional[bool], used_for: str, without: str) -> dict:
    # a missing feature that nothing falls back from is "not used"
    return {"feature": feature, "present": present, "used for": used_for,
            "without it": without or ("not used" if present is False else "")}


def npu_line_report(torch_npu_module=None, torchair_module=None, ge_probe_device=None) -> dict:
    """The torch_npu line installed and what it lacks: ``torch_npu``, ``line`` (a sentence),
    ``rows`` (``feature``, ``present``, ``used for``, ``without it``) and ``lacks`` (the features
    that are missing). torchair is imported when ``torchair_module`` is not given. With
    ``ge_probe_device`` (an NPU device) each fused op and each INT8 path is also compiled alone into a GE graph to see
    whether this torchair has a GE converter for it (``ge_support.ge_probe``); otherwise those rows say
    "not probed" (``present`` None) and are not counted as lacking."""
    if torch_npu_module is None:
        return {"torch_npu": None, "line": message("torch_npu not loaded: no NPU line to detect"), "rows": [],
                "lacks": []}
    version = versions.torch_npu_version(torch_npu_module)
    row = next((r for r in versions.KNOWN_GOOD if r["torch_npu"] == version), None)
    line = f"torch_npu {version}" + (f" (torch {row['torch']}, CANN {row['cann']} in the known-good table)" if row
                                     else " (not in the known-good table)")
    rows = [_line_row(f"torch_npu.{name}", hasattr(torch_npu_module, name), used, fallback)
            for name, (_since, used, fallback) in versions.TORCH_NPU_OPS.items()]
    torchair = torchair_module
    if torchair is None:
        try:
            import torchair  # noqa: F811  (ships with torch_npu)
        except Exception:  # a torch_npu built without torchair, or one that fails to load it
            torchair = None
    rows.append(_line_row(
        "torchair", torchair is not None, "graph mode on the NPU",
        "graph-mode rungs fail with the reason (backend='npu' would run eagerly)"))
    modes, takes_options = None, False
    if torchair is not None:
        config = torchair.CompilerConfig()
        modes = ops.torchair_modes(config)
        takes_options = ops.backend_takes_options(torchair.get_npu_backend(compiler_config=config))
    for mode in ops.NPU_GRAPH_MODES:
        present = torchair is not None and (mode in (modes or ()) or (mode == "max-autotune" and not modes))
        scope = " (the whole graph to GE)" if mode == "max-autotune" else " (aclgraph)"
        needs = f"an error naming what it needs: {ops.TORCHAIR_MODE_SINCE.get(mode, 'torchair')}"
        rows.append(_line_row(f"torchair mode {mode}", present, f"npu_graph_mode={mode}{scope}",
                              "" if present else needs))
    rows.append(_line_row(
        "torchair backend options", takes_options,
        "torch.compile(options=...) to torchair (from torchair 7.3.0)",
        "none are passed; the workbook passes only guard_filter_fn, which torch takes"))
    for name, needs in ge_support.GE_PROBE_OPS.items():
        if not all(hasattr(torch_npu_module, op) for op in needs) or torchair is None:
            continue
        present = None
        if ge_probe_device is not None:
            backend_fn = torchair.get_npu_backend(compiler_config=torchair.CompilerConfig())
            present = ge_support.ge_probe(name, backend_fn, ge_probe_device, torch.float16) is None
        used, fallback = _GE_ROWS[name]
        without = ("not probed: needs an NPU" if present is None else
                   "" if present else f"{fallback} inside GE graphs (ge_support.ge_fallbacks)")
        rows.append(_line_row(f"GE converter for torch_npu.{name}", present, used, without))
    return {"torch_npu": version, "line": line, "rows": rows,
            "lacks": [r["feature"] for r in rows if r["present"] is False]}
