"""Chapter 00's own study (layer: chapter studies; taught in 00_environment_check): the tables that
chapter shows of the device, the dtype choice and the torch_npu line, built from the layers below."""
from __future__ import annotations

from typing import Optional

import torch

from . import ge_support, ops, versions

# --- the device and the dtype choice (from backend and dtype_choice) -----------------------------


# --- the torch_npu line and its graph modes (from versions and ge_support) ----------------------

def pairing_check(torch_version: str, torch_npu_version: Optional[str],
                  cann: Optional[str] = None) -> dict:
    """Does this torch_npu pair with this torch (and CANN)? Returns verdict + advice."""
    if not torch_npu_version:
        return {"ok": None, "verdict": "torch_npu not installed: nothing to pair", "advice": ""}
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
        return {"torch_npu": None, "line": "torch_npu not loaded: no NPU line to detect", "rows": [], "lacks": []}
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
