"""Versions: the support floor, the known-good torch / torch_npu / CANN pairs, the torch_npu ops
per release, feature detection and the shims for both transformers lines (layer: foundations;
taught in 00_environment_check).

Chapter 00's pairing verdict and line report read the tables here (``environment_study``); quant
and the fused operators word their messages from ``TORCH_NPU_OPS``. Helpers call ``has_feature``
instead of assuming a recent torch, so they also run on the torch 2.1 of older Ascend images,
and the transformers shims at the end of this file instead of assuming one transformers line: setup
installs transformers 5.x (current pinned set) or 4.57.x (legacy set, Python 3.9-3.10 or torch
2.1-2.5). Importing this module imports neither torch nor transformers (the claims audit reads
``KNOWN_GOOD`` without them).
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


def dotted(numbers) -> str:
    """(2, 1, 0) -> '2.1.0'."""
    return ".".join(map(str, numbers))


def check_support_floor(torch_version: Optional[str] = None) -> None:
    """Raise ImportError with advice when torch is older than the floor."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    if version_tuple(torch_version) < MIN_TORCH:
        raise ImportError(
            f"ascend-llama-workbook needs torch >= {dotted(MIN_TORCH)}, found {torch_version}. "
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
                f"[{dotted(low)}, {dotted(high)}); run make setup to install the pinned version")
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
            f"ascend-llama-workbook needs transformers >= {dotted(low)} (the notebooks "
            f"pass dtype= and build caches from a config), found {version}. Run make setup, which "
            "picks requirements-common.txt (transformers 5.x) or requirements-legacy.txt (4.57.x)."
        )
    message = check_transformers(version)
    if message:
        warnings.warn(message, stacklevel=2)


# --- features that newer torch versions added; helpers check before using them --------------
FEATURES = {  # name -> dotted attribute path under torch
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
    if name not in FEATURES:
        raise KeyError(f"unknown feature {name!r}; known: {', '.join(FEATURES)}")
    import torch

    return has_attribute(torch, FEATURES[name])


# --- the torch_npu ops the workbook calls, per release ------------------------------------------
# Each op: the first torch_npu line that has it (op-plugin's op_plugin_functions.yaml of each release
# branch; Ascend/pytorch COMPATIBILITY.en.md), what it is for in the workbook, and what runs without
# it. The table only words messages and chapter 00's rows: whether an op is there is always checked
# on the installed torch_npu (hasattr), never from a version.
TORCH_NPU_OPS = {
    "npu_rms_norm": ("torch_npu 2.1.0 (CANN 7.0.0)", "fused RMSNorm (chapters 01, 06)",
                     "F.rms_norm or the reference formula"),
    "npu_add_rms_norm": ("torch_npu 2.1.0.post4 (CANN 8.0.RC1)", "fused residual add + RMSNorm (chapter 01)",
                         "add, then the RMSNorm above"),
    "npu_swiglu": ("torch_npu 2.1.0.post4 (CANN 8.0.RC1)", "fused SwiGLU (chapters 02, 06)",
                   "the reference silu(gate) * up"),
    "npu_weight_quant_batchmatmul": ("torch_npu 2.1.0.post4 (CANN 8.0.RC1)", "W8A16 kernel (chapters 05, 06)",
                                     "the dequantize-in-forward INT8 kernel"),
    "npu_dynamic_quant": ("torch_npu 2.1.0.post6 (CANN 8.0.RC2)", "dynamic W8A8 activations (chapter 05)",
                          "W8A8 emulated, quality only"),
    "npu_quant_matmul": ("torch_npu 2.1.0.post4 (CANN 8.0.RC1)", "W8A8 kernel (chapter 05)",
                         "W8A8 emulated, quality only"),
    "npu_trans_quant_param": ("torch_npu 2.1.0.post4 (CANN 8.0.RC1)",
                              "int64 scale for static W8A8 in graph mode (chapter 05)",
                              "W8A8 emulated, quality only"),
}


def torch_npu_version(torch_npu_module) -> str:
    """The version of a loaded torch_npu module, for messages; ``"not loaded"`` for None."""
    if torch_npu_module is None:
        return "not loaded"
    return str(getattr(torch_npu_module, "__version__", "unknown"))


def npu_op_missing(name: str, torch_npu_module) -> Optional[str]:
    """None when ``torch_npu_module`` (the loaded torch_npu, or None) has op ``name``; otherwise
    why not, for messages."""
    if torch_npu_module is not None and hasattr(torch_npu_module, name):
        return None
    since = TORCH_NPU_OPS[name][0] if name in TORCH_NPU_OPS else "a newer torch_npu"
    if torch_npu_module is None:
        return f"torch_npu is not loaded, so torch_npu.{name} is not there"
    return f"torch_npu {torch_npu_version(torch_npu_module)} has no torch_npu.{name} (it arrived with {since})"


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
