"""Versions: the support floor, torch / torch_npu / CANN pairing, feature detection and the
shims for both transformers lines.

Taught in ``00_environment_check.ipynb``. Helpers call ``has_feature`` instead of assuming a
recent torch, so they also run on the torch 2.1 of older Ascend images, and the transformers shims
at the end of this file instead of assuming one transformers line: setup installs transformers 5.x
(current pinned set) or 4.57.x (legacy set, Python 3.9-3.10 or torch 2.1-2.5). Importing this module
imports neither torch nor transformers (the claims audit reads ``KNOWN_GOOD`` without them).
"""
from __future__ import annotations

import operator
import re
from typing import Optional

MIN_TORCH = (2, 1, 0)
# Both pinned lines: 4.57.x (legacy set) and 5.x (current). 4.56 is the first release that takes
# dtype= in from_pretrained and builds a DynamicCache from a config, which the helpers rely on.
TRANSFORMERS_RANGE = ((4, 56, 0), (6, 0, 0))

# Known-good torch_npu / CANN pairs from Ascend/pytorch COMPATIBILITY.en.md (see
# shared reference). torch_npu X.Y.Z[.postN] always pairs with torch X.Y.Z.
KNOWN_GOOD = [
    {"torch_npu": "2.1.0", "torch": "2.1.0", "cann": "7.0.0"},
    {"torch_npu": "2.1.0.post6", "torch": "2.1.0", "cann": "8.0.RC2"},  # pytorch_2.1.0-cann_8.0.rc2 image
    {"torch_npu": "2.1.0.post10", "torch": "2.1.0", "cann": "8.0.0"},
    {"torch_npu": "2.1.0.post12", "torch": "2.1.0", "cann": "8.1.RC1"},
    {"torch_npu": "2.1.0.post17", "torch": "2.1.0", "cann": "8.3.RC1"},
    {"torch_npu": "2.3.1.post6", "torch": "2.3.1", "cann": "8.1.RC1"},
    {"torch_npu": "2.4.0.post4", "torch": "2.4.0", "cann": "8.1.RC1"},
    {"torch_npu": "2.5.1", "torch": "2.5.1", "cann": "8.1.RC1"},
    {"torch_npu": "2.6.0.post5", "torch": "2.6.0", "cann": "8.5.0"},
    {"torch_npu": "2.7.1", "torch": "2.7.1", "cann": "8.3.RC1"},  # pytorch_2.7.1-cann_8.3.rc1 image
    {"torch_npu": "2.9.0.post2", "torch": "2.9.0", "cann": "9.0.0"},
    {"torch_npu": "2.12.0", "torch": "2.12.0", "cann": "9.1.0"},
]


def version_tuple(version: str) -> tuple[int, int, int]:
    """'2.1.0.post10' / '2.13.0+cpu' / '5.24.0.dev0' -> (major, minor, patch)."""
    numbers = [int(n) for n in re.findall(r"\d+", str(version).split("+")[0])[:3]]
    return tuple((numbers + [0, 0, 0])[:3])  # type: ignore[return-value]


def _dotted(numbers) -> str:
    return ".".join(map(str, numbers))


def check_support_floor(torch_version: Optional[str] = None) -> None:
    """Raise ImportError with advice when torch is older than the floor."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    if version_tuple(torch_version) < MIN_TORCH:
        raise ImportError(
            f"ascend-llama-workbook needs torch >= {_dotted(MIN_TORCH)}, found {torch_version}. "
            "On Ascend, pick a CANN image with torch >= 2.1 and its paired torch_npu "
            "(e.g. torch 2.1.0 + torch_npu 2.1.0.post10 + CANN 8.0)."
        )


def installed_version(package: str) -> Optional[str]:
    """The installed distribution's version without importing it (importing transformers is slow)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def check_transformers(version: Optional[str] = None) -> Optional[str]:
    """A warning text when transformers is outside the tested range, else None."""
    if version is None:
        version = installed_version("transformers")
        if version is None:
            return "transformers is not installed; run make setup"
    low, high = TRANSFORMERS_RANGE
    if not (low <= version_tuple(version) < high):
        return (f"transformers {version} is outside the tested range "
                f"[{_dotted(low)}, {_dotted(high)}); run make setup to install the pinned version")
    return None


def check_transformers_floor(version: Optional[str] = None) -> None:
    """Raise ImportError below the tested transformers range; warn above it (may still work)."""
    import warnings

    if version is None:
        version = installed_version("transformers")
        if version is None:
            return  # reported by the chapters that need it, with the setup command
    low, _ = TRANSFORMERS_RANGE
    if version_tuple(version) < low:
        raise ImportError(
            f"ascend-llama-workbook needs transformers >= {_dotted(low)} (the notebooks "
            f"pass dtype= and build caches from a config), found {version}. Run make setup, which "
            "picks requirements-common.txt (transformers 5.x) or requirements-legacy.txt (4.57.x)."
        )
    message = check_transformers(version)
    if message:
        warnings.warn(message, stacklevel=2)


def pairing_check(torch_version: str, torch_npu_version: Optional[str],
                  cann: Optional[str] = None) -> dict:
    """Does this torch_npu pair with this torch (and CANN)? Returns verdict + advice."""
    if not torch_npu_version:
        return {"ok": None, "verdict": "torch_npu not installed: nothing to pair", "advice": ""}
    t, n = version_tuple(torch_version), version_tuple(torch_npu_version)
    if t != n:
        want = _dotted(n)
        known = [r["torch_npu"] for r in KNOWN_GOOD if version_tuple(r["torch"]) == t]
        other = (f"torch_npu {known[-1]} (known-good for torch {_dotted(t)})" if known
                 else f"a torch_npu {_dotted(t)}.x build")
        return {
            "ok": False,
            "verdict": f"torch {torch_version} does not pair with torch_npu {torch_npu_version}",
            "advice": f"torch_npu {torch_npu_version} needs torch {want}: "
                      f"pip install torch=={want} (CPU wheel), or install {other} to match "
                      f"torch {torch_version}",
            "matching_torch": want,
            "matching_torch_npu": known[-1] if known else None,
        }
    row = next((r for r in KNOWN_GOOD if r["torch_npu"] == torch_npu_version), None)
    if row is None:
        return {"ok": True, "verdict": f"torch and torch_npu versions pair ({torch_version})",
                "advice": "this torch_npu build is not in the known-good table; check "
                          "Ascend/pytorch COMPATIBILITY for its CANN version"}
    if cann and version_tuple(cann)[:2] != version_tuple(row["cann"])[:2]:
        return {"ok": True, "verdict": f"torch/torch_npu pair; CANN {cann} differs from the "
                                       f"documented {row['cann']}",
                "advice": f"torch_npu {torch_npu_version} is documented with CANN {row['cann']}"}
    return {"ok": True, "verdict": f"known-good: torch {row['torch']} + torch_npu "
                                   f"{row['torch_npu']} + CANN {row['cann']}", "advice": ""}


# --- features that newer torch versions added; helpers check before using them --------------
_FEATURES = {  # name -> dotted attribute path under torch
    "F.rms_norm": "nn.functional.rms_norm",
    "nn.RMSNorm": "nn.RMSNorm",
    "torch.accelerator": "accelerator",
    "torch._weight_int8pack_mm": "_weight_int8pack_mm",
    "torch.compile": "compile",
}


def has_attribute(root, dotted: str) -> bool:
    """Whether ``root`` has the attribute path ``dotted`` (``"nn.functional.rms_norm"``)."""
    try:
        operator.attrgetter(dotted)(root)
    except AttributeError:
        return False
    return True


def has_feature(name: str) -> bool:
    if name not in _FEATURES:
        raise KeyError(f"unknown feature {name!r}; known: {', '.join(_FEATURES)}")
    import torch

    return has_attribute(torch, _FEATURES[name])


def feature_table() -> dict[str, bool]:
    return {name: has_feature(name) for name in _FEATURES}


# --- which torch_npu line is installed, and what it lacks (chapter 00) ------------------------
# What each feature is for in the workbook and what runs without it. Presence is always checked on
# the installed torch_npu / torchair (hasattr, CompilerConfig's own options), never from a version.
_LINE_FEATURES = [
    ("torch_npu.npu_rms_norm", "fused RMSNorm (chapters 01, 06)", "F.rms_norm or the reference formula"),
    ("torch_npu.npu_add_rms_norm", "fused residual add + RMSNorm (chapter 01)", "add, then the RMSNorm above"),
    ("torch_npu.npu_swiglu", "fused SwiGLU (chapters 02, 06)", "the reference silu(gate) * up"),
    ("torch_npu.npu_weight_quant_batchmatmul", "W8A16 kernel (chapters 05, 06)",
     "the dequantize-in-forward INT8 kernel"),
    ("torch_npu.npu_dynamic_quant", "dynamic W8A8 activations (chapter 05)", "W8A8 emulated, quality only"),
    ("torch_npu.npu_quant_matmul", "W8A8 kernel (chapter 05)", "W8A8 emulated, quality only"),
    ("torch_npu.npu_trans_quant_param", "int64 scale for static W8A8 in graph mode (chapter 05)",
     "W8A8 emulated, quality only"),
]


# Each GE probe's row (ops.GE_PROBE_OPS): what the op inside a GE graph is for, and what runs without it.
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
    whether this torchair has a GE converter for it (``ops.ge_probe``); otherwise those rows say
    "not probed" (``present`` None) and are not counted as lacking."""
    if torch_npu_module is None:
        return {"torch_npu": None, "line": "torch_npu not loaded: no NPU line to detect", "rows": [], "lacks": []}
    import torch

    from .ops import GE_PROBE_OPS, NPU_GRAPH_MODES, TORCHAIR_MODE_SINCE, backend_takes_options, ge_probe, torchair_modes

    version = str(getattr(torch_npu_module, "__version__", "unknown"))
    row = next((r for r in KNOWN_GOOD if r["torch_npu"] == version), None)
    line = f"torch_npu {version}" + (f" (torch {row['torch']}, CANN {row['cann']} in the known-good table)" if row
                                     else " (not in the known-good table)")
    rows = [_line_row(name, hasattr(torch_npu_module, name.split(".", 1)[1]), used, fallback)
            for name, used, fallback in _LINE_FEATURES]
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
        modes = torchair_modes(config)
        takes_options = backend_takes_options(torchair.get_npu_backend(compiler_config=config))
    for mode in NPU_GRAPH_MODES:
        present = torchair is not None and (mode in (modes or ()) or (mode == "max-autotune" and not modes))
        scope = " (the whole graph to GE)" if mode == "max-autotune" else " (aclgraph)"
        needs = f"an error naming what it needs: {TORCHAIR_MODE_SINCE.get(mode, 'torchair')}"
        rows.append(_line_row(f"torchair mode {mode}", present, f"npu_graph_mode={mode}{scope}",
                              "" if present else needs))
    rows.append(_line_row(
        "torchair backend options", takes_options,
        "torch.compile(options=...) to torchair (from torchair 7.3.0)",
        "none are passed; the workbook passes only guard_filter_fn, which torch takes"))
    for name, needs in GE_PROBE_OPS.items():
        if not all(hasattr(torch_npu_module, op) for op in needs) or torchair is None:
            continue
        present = None
        if ge_probe_device is not None:
            backend_fn = torchair.get_npu_backend(compiler_config=torchair.CompilerConfig())
            present = ge_probe(name, backend_fn, ge_probe_device, torch.float16) is None
        used, fallback = _GE_ROWS[name]
        without = ("not probed: needs an NPU" if present is None else
                   "" if present else f"{fallback} inside GE graphs (ops.ge_fallbacks)")
        rows.append(_line_row(f"GE converter for torch_npu.{name}", present, used, without))
    return {"torch_npu": version, "line": line, "rows": rows,
            "lacks": [r["feature"] for r in rows if r["present"] is False]}


# --- transformers 4.57.x (legacy set) and 5.x (current set): detect, never assume --------------
def transformers_line(version: Optional[str] = None) -> str:
    """'5.x' or '4.x': which pinned transformers line is installed (or ``version`` belongs to)."""
    if version is None:
        import transformers

        version = transformers.__version__
    return f"{version_tuple(version)[0]}.x"


def cache_argument(model) -> str:
    """The keyword a model's forward takes its KV cache by: ``past_key_values`` on 4.57 (and 5.x
    so far); ``cache`` where a release renames it. Detected from the signature, not the version."""
    import inspect

    # The class's forward: an instance's forward may be a compiled wrapper without the signature.
    forward = getattr(type(model), "forward", None) or getattr(model, "forward", model)
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a compiled or C-level forward: the long-standing name
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def cache_of(output):
    """The KV cache a forward returned, under whichever name this transformers uses."""
    for name in ("cache", "past_key_values"):
        value = output.get(name, None) if hasattr(output, "get") else getattr(output, name, None)
        if value is not None:
            return value
    return None


def converted_model_folder(name: str, version: Optional[str] = None) -> str:
    """The cache folder name for a model converted (saved) by this transformers line.

    A folder written by transformers 5.x does not load correctly on 4.57: the tokenizer class
    (``TokenizersBackend``) is unknown there, and 4.57 ignores 5.x's ``rope_parameters`` and would
    silently fall back to the default RoPE theta. So each line converts into its own folder; the
    5.x folder keeps the plain name that existing caches already use.
    """
    line = transformers_line(version)
    return name if line == "5.x" else f"{name}-transformers{line[0]}"


def drop_quantization_config(model) -> None:
    """Let ``save_pretrained`` write a model loaded from GGUF (its weights are dense after loading).

    transformers 5.x attaches a GGUF ``hf_quantizer`` and refuses to save it; 4.57 usually attaches
    none but may leave ``quantization_config`` on the config. Both lines' quantizers implement
    ``remove_quantization_config``; without a quantizer the config attributes are dropped directly.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    for attribute in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attribute):
            delattr(model.config, attribute)
