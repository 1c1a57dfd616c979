"""Llama's small operators, each with one plain reference and a fused path per backend.

Taught in ``01_operator_verification.ipynb`` (RMSNorm, residual add + RMSNorm) and
``02_ffn_fusion.ipynb`` (SwiGLU FFN, graph mode); later chapters call ``apply_fused_modules`` to
measure "fused" end to end.

Every operator takes ``impl``:

* ``"reference"`` - the textbook formula, written out so a reader can check it (float32 inside,
  like ``transformers``' ``LlamaRMSNorm``);
* ``"npu"`` - the real torch_npu fused op (``npu_rms_norm``, ``npu_add_rms_norm``,
  ``npu_swiglu``); the guides' ``torch_npu.npu.rms_norm`` / ``fused_add_norm`` /
  ``linear_activation`` do not exist;
* ``"torch"`` - the best stock PyTorch op (``F.rms_norm`` where this torch has it, otherwise the
  reference);
* ``"compiled"`` - the reference under ``torch.compile`` (inductor fuses the elementwise chain;
  torchair on an NPU);
* ``"auto"`` - ``"npu"`` for NPU tensors where this torch_npu has the op (``hasattr``, never a
  version guess: torch_npu 2.1.0 has only ``npu_rms_norm``), ``"torch"`` / ``"reference"`` elsewhere.

``resolve_impl`` says which of these really runs and ``explain_impl`` why, so notebooks can label
each figure's code path. Graph mode on an NPU goes through torchair; ``npu_graph_plan`` reads what
this torchair offers from its own ``CompilerConfig`` (``mode`` exists only from torchair 7.0.0,
``npugraph_ex`` from 26.0.0) and ``ge_fallbacks`` keeps a fused op out of a GE graph where this
torchair has no GE converter for it.
"""
from __future__ import annotations

import inspect
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import backend, versions

RMS_IMPLS = ("auto", "reference", "npu", "torch", "compiled")
SWIGLU_IMPLS = ("auto", "reference", "npu", "compiled")
FFN_VARIANTS = ("unfused", "merged", "fused_act", "graph")


# --- argument checks: fail before any work, naming the parameter -----------------------------

def _device_kind(device) -> str:
    """``"npu"`` / ``"cuda"`` / ``"cpu"`` from a tensor, device or string (``torch.device("npu")``
    only parses once torch_npu is imported, so strings are read as text)."""
    if isinstance(device, (torch.Tensor, backend.DeviceChoice)):
        return device.device.type
    if isinstance(device, torch.device):
        return device.type
    return str(device).split(":")[0].strip().lower()


def _check_impl(impl: str, choices, parameter: str = "impl") -> None:
    if impl not in choices:
        raise ValueError(f"{parameter}={impl!r} is not valid; choose one of {', '.join(map(repr, choices))}")


def _check_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"x must be a tensor with at least one dim; got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight (gamma) must have shape ({x.shape[-1]},) to match the last dim of x "
                         f"{tuple(x.shape)}; got {shape}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps={eps!r} is not valid; it must be a number > 0 such as 1e-6")


# The torch_npu op behind each fused operator, and the first torch_npu line that has it (op-plugin's
# op_plugin_functions.yaml of each release branch; Ascend/pytorch COMPATIBILITY.en.md). The table only
# words messages: whether an op is there is always checked with hasattr on the installed torch_npu.
NPU_OPS = {"rms_norm": "npu_rms_norm", "add_rms_norm": "npu_add_rms_norm", "swiglu": "npu_swiglu"}
NPU_OP_SINCE = {
    "npu_rms_norm": "torch_npu 2.1.0 (CANN 7.0.0)",
    "npu_add_rms_norm": "torch_npu 2.1.0.post4 (CANN 8.0.RC1)",
    "npu_swiglu": "torch_npu 2.1.0.post4 (CANN 8.0.RC1)",
    "npu_weight_quant_batchmatmul": "torch_npu 2.1.0.post4 (CANN 8.0.RC1)",
    "npu_quant_matmul": "torch_npu 2.1.0.post4 (CANN 8.0.RC1)",
    "npu_trans_quant_param": "torch_npu 2.1.0.post4 (CANN 8.0.RC1)",
    "npu_dynamic_quant": "torch_npu 2.1.0.post6 (CANN 8.0.RC2)",
}


def _torch_npu_version(module=None) -> str:
    module = module if module is not None else backend.import_torch_npu().module
    return str(getattr(module, "__version__", "unknown")) if module is not None else "not loaded"


def npu_op_missing(name: str) -> Optional[str]:
    """None when the installed torch_npu has op ``name``; otherwise why not, for messages."""
    module = backend.import_torch_npu().module
    if module is not None and hasattr(module, name):
        return None
    since = NPU_OP_SINCE.get(name, "a newer torch_npu")
    if module is None:
        return f"torch_npu is not loaded, so torch_npu.{name} is not there"
    return f"torch_npu {_torch_npu_version(module)} has no torch_npu.{name} (it arrived with {since})"


def resolve_impl(impl: str, device, op: str = "rms_norm") -> str:
    """The implementation that really runs for ``impl`` on ``device`` (``auto`` and fallbacks
    resolved); ``op`` is ``"rms_norm"``, ``"add_rms_norm"`` or ``"swiglu"``."""
    _check_impl(impl, SWIGLU_IMPLS if op == "swiglu" else RMS_IMPLS)
    if impl == "auto":
        if _device_kind(device) == "npu" and npu_op_missing(NPU_OPS[op]) is None:
            return "npu"
        impl = "reference" if op == "swiglu" else "torch"
    if impl == "npu":
        _npu_op(NPU_OPS[op])  # an explicit request fails here, naming the op this line lacks
    if impl == "torch" and not versions.has_feature("F.rms_norm"):
        return "reference"  # torch < 2.4 (the 2.1 of older Ascend images) has no F.rms_norm
    return impl


def explain_impl(impl: str, device, op: str = "rms_norm") -> tuple:
    """``(resolve_impl(...), why)``: the implementation that runs and the reason, for a chapter to print."""
    chosen, kind, npu_name = resolve_impl(impl, device, op), _device_kind(device), NPU_OPS[op]
    if impl == "auto" and kind == "npu":
        if chosen == "npu":
            return chosen, f"auto on an NPU: torch_npu.{npu_name} exists in torch_npu {_torch_npu_version()}"
        return chosen, f"auto on an NPU: {npu_op_missing(npu_name)}; the {chosen} implementation runs instead"
    if impl == "npu":
        return chosen, f"impl='npu' requested: torch_npu.{npu_name}"
    if impl == "auto":
        why = f"auto on {kind}: torch_npu.{npu_name} is an NPU op"
        return chosen, why + ("; F.rms_norm" if chosen == "torch" else "; the reference formula")
    if chosen != impl:
        return chosen, f"impl={impl!r} requested; this torch has no F.rms_norm (torch >= 2.4), so the reference runs"
    return chosen, f"impl={impl!r} requested"


def _torch_npu():
    found = backend.import_torch_npu()
    if not found.ok:
        raise RuntimeError(f"impl='npu' needs torch_npu, which could not be imported: {found.error}. "
                           f"{found.hint or ''} Use impl='auto' to pick an implementation for this device.")
    return found.module


def _npu_op(name: str):
    """``torch_npu.<name>``, or a clear error naming this torch_npu and the line that has the op."""
    fn = getattr(_torch_npu(), name, None)
    if fn is None:
        raise RuntimeError(f"impl='npu' needs torch_npu.{name}, but {npu_op_missing(name)}. "
                           "Use impl='auto' to fall back to an implementation this line has.")
    return fn


# --- graph mode ---------------------------------------------------------------------------------

# npu_graph_mode values: "max-autotune" = the whole graph to GE (torchair's default), "reduce-overhead"
# = aclgraph capture/replay (torchair 7.0.0 and newer; "不再演进" after torch_npu 7.3.0, torchair
# docs/zh/overview.md), "npugraph_ex" = its successor (in CompilerConfig.mode from torchair 26.0.0).
NPU_GRAPH_MODES = ("max-autotune", "reduce-overhead", "npugraph_ex")
# Where each mode first appears (torchair configs/compiler_config.py on each branch; the commits the
# Ascend/pytorch release branches pin; COMPATIBILITY.en.md): for messages only, never to decide.
TORCHAIR_MODE_SINCE = {
    "reduce-overhead": "torchair 7.0.0, i.e. torch_npu 2.1.0.post12, 2.3.1.post6, 2.4.0.post4 or 2.5.1 "
                       "(CANN 8.1.RC1) and newer",
    "npugraph_ex": "torchair 26.0.0, i.e. torch_npu 2.7.1.post4, 2.8.0.post4 or 2.9.0.post2 (CANN 9.0.0) and newer",
}


def _import_torchair():
    try:
        import torchair  # ships inside torch_npu builds that include it
    except ImportError as exc:
        raise RuntimeError(
            "graph mode on an NPU needs torchair, which could not be imported "
            f"({exc}); it ships with torch_npu - reinstall a torch_npu build that includes it. "
            "torch.compile(backend='npu') would silently run eagerly without it.") from exc
    return torchair


def torchair_modes(config) -> Optional[tuple]:
    """The values this torchair's ``CompilerConfig.mode`` accepts, read from the config itself:
    None where the config has no ``mode`` option (torchair before 7.0.0), ``()`` where it has one
    without a list of choices."""
    fixed = getattr(config, "_fixed_attrs", None)
    if isinstance(fixed, (list, tuple)) and "mode" not in fixed:
        return None
    try:
        option = getattr(config, "mode")
    except AttributeError:
        return None
    optional = getattr(option, "optional", None)
    return tuple(optional) if isinstance(optional, (list, tuple)) else ()


def npu_graph_plan(mode: Optional[str] = None) -> dict:
    """What torchair builds for ``npu_graph_mode=mode`` on this torch_npu line, and why.

    Decided from the ``CompilerConfig`` this torchair really has: ``max-autotune`` on a torchair
    without a ``mode`` option is its default GE graph, built with no option set; ``reduce-overhead``
    or ``npugraph_ex`` where the config does not offer them is an error naming the torch_npu they
    need. Returns ``requested``, ``mode_set`` (what was assigned to ``config.mode``, or None),
    ``graph`` (``"GE"`` or ``"aclgraph"``), ``reason``, ``torch_npu`` and the ``config`` itself.
    """
    if mode is not None and mode not in NPU_GRAPH_MODES:
        raise ValueError(f"npu_graph_mode={mode!r} is not valid; choose one of "
                         f"{', '.join(map(repr, NPU_GRAPH_MODES))} or None for torchair's default")
    torchair = _import_torchair()
    config = torchair.CompilerConfig()
    modes = torchair_modes(config)
    version = _torch_npu_version()
    plan = {"requested": mode, "mode_set": None, "graph": "GE", "torch_npu": version, "config": config,
            "modes": modes}
    if mode is None:
        plan["reason"] = "torchair's default config: the whole graph to GE"
    elif modes is None:
        if mode != "max-autotune":
            raise RuntimeError(
                f"npu_graph_mode={mode!r} needs torchair's CompilerConfig.mode, which the torchair of "
                f"torch_npu {version} does not have: {mode} arrived with {TORCHAIR_MODE_SINCE[mode]}. Use "
                "npu_graph_mode='max-autotune' (the GE graph, this torchair's default) or an image with a "
                "newer torch_npu.")
        plan["reason"] = (f"the torchair of torch_npu {version} has no CompilerConfig.mode; its default is the "
                          "GE graph max-autotune names, so no option was set")
    elif modes and mode not in modes:
        raise RuntimeError(
            f"npu_graph_mode={mode!r} is not offered by the torchair of torch_npu {version} (its "
            f"CompilerConfig.mode takes {', '.join(modes)}): {mode} arrived with {TORCHAIR_MODE_SINCE[mode]}.")
    else:
        config.mode = mode
        plan["mode_set"] = mode
        plan["graph"] = "GE" if mode == "max-autotune" else "aclgraph"
        plan["reason"] = f"CompilerConfig.mode = {mode!r}: " + (
            "the whole graph to GE" if mode == "max-autotune" else "aclgraph capture and replay")
        if mode == "reduce-overhead" and "npugraph_ex" in (modes or ()):
            plan["reason"] += "; deprecated on this torchair in favour of npugraph_ex"
    return plan


def npu_graph_backend(mode: Optional[str] = None, plan: Optional[dict] = None):
    """torchair's backend for ``torch.compile``, built from ``npu_graph_plan`` (``backend="npu"``
    is the same with the default config; building it lets ``mode`` be chosen where torchair offers it)."""
    plan = plan if plan is not None else npu_graph_plan(mode)
    return _import_torchair().get_npu_backend(compiler_config=plan["config"])


def backend_takes_options(backend_fn) -> bool:
    """Whether a compile backend accepts torch.compile's ``options`` (a ``**kwargs`` parameter):
    torchair's ``_npu_backend`` does only from torchair 7.3.0 (7.2.0's takes none)."""
    fn = getattr(backend_fn, "func", backend_fn)  # get_npu_backend returns a functools.partial
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True  # cannot tell: let the backend decide
    return any(p.kind is p.VAR_KEYWORD for p in parameters)


# What each GE probe puts into a graph: the fused ops alone, the INT8 ops as an ``Int8Linear`` of
# helpers.quant calls them (W8A16; dynamic W8A8 = npu_dynamic_quant + npu_quant_matmul with a per-token
# scale; static W8A8 = npu_quant_matmul with the scale npu_trans_quant_param made at quantization time,
# outside the graph). The key is the op a missing converter is reported for; the value lists every
# torch_npu op the probe needs to exist.
GE_PROBE_OPS = {
    "npu_rms_norm": ("npu_rms_norm",),
    "npu_add_rms_norm": ("npu_add_rms_norm",),
    "npu_swiglu": ("npu_swiglu",),
    "npu_weight_quant_batchmatmul": ("npu_weight_quant_batchmatmul",),
    "npu_dynamic_quant": ("npu_dynamic_quant", "npu_quant_matmul"),
    "npu_quant_matmul": ("npu_quant_matmul", "npu_trans_quant_param"),
}
# The INT8 probes: (scheme, static activation scale) of the Int8Linear they compile
_GE_INT8_PROBES = {"npu_weight_quant_batchmatmul": ("w8a16", None), "npu_dynamic_quant": ("w8a8", None),
                   "npu_quant_matmul": ("w8a8", 4.0 / 127)}


def _ge_probe_case(name: str, npu, device, dtype):
    """``(fn, inputs)``: the small graph that probes ``name`` (a key of ``GE_PROBE_OPS``)."""
    x = torch.randn(2, 8, device=device, dtype=dtype)
    if name == "npu_rms_norm":
        return (lambda t: npu.npu_rms_norm(t, torch.ones_like(t[0]), 1e-6)[0]), (x,)
    if name == "npu_add_rms_norm":
        return (lambda t: npu.npu_add_rms_norm(t, t, torch.ones_like(t[0]), 1e-6)[0]), (x,)
    if name == "npu_swiglu":
        return (lambda t: npu.npu_swiglu(t, dim=-1)), (x,)
    from . import quant  # quant imports this module

    scheme, act_scale = _GE_INT8_PROBES[name]
    linear = nn.Linear(8, 8, bias=False).to(device=device, dtype=dtype)
    return quant.Int8Linear(linear, impl="npu", scheme=scheme, act_scale=act_scale), (x,)


def ge_probe(name: str, backend_fn, device, dtype) -> Optional[str]:
    """None when ``torch_npu.<name>`` compiles into a GE graph with ``backend_fn``; else the error.

    An op needs a GE converter in torchair to be inside a GE graph (``Unsupported torch op ... by
    ge`` otherwise), and which ops have one depends on the torchair version. A two-row graph with
    only that op (the INT8 ops: an ``Int8Linear`` calling them as the INT8 rungs do, see
    ``GE_PROBE_OPS``) answers the question for this torchair, whatever its version.
    """
    if name not in GE_PROBE_OPS:
        raise ValueError(f"name={name!r} is not valid; choose one of {', '.join(map(repr, GE_PROBE_OPS))}")
    fn, inputs = _ge_probe_case(name, backend.import_torch_npu().module, device, dtype)
    try:
        torch.compile(fn, backend=backend_fn, dynamic=False, fullgraph=True)(*inputs)
    except Exception as exc:  # torchair raises inside dynamo's compile step
        inner = getattr(exc, "inner_exception", None) or exc
        return next((line for line in str(inner).splitlines() if line.strip()), type(inner).__name__)
    return None


def _ge_probe_name(module) -> Optional[str]:
    """The ``GE_PROBE_OPS`` key a module's NPU path puts into a graph, or None (not an NPU op user)."""
    if type(module) is FusedRMSNorm and module.impl == "npu":
        return "npu_rms_norm"
    if type(module) is FusedLlamaMLP and module.impl == "npu":
        return "npu_swiglu"
    if getattr(module, "impl", None) == "npu" and hasattr(module, "use_fallback_kernel"):  # quant.Int8Linear
        if module.scheme == "w8a16":
            return "npu_weight_quant_batchmatmul"
        return "npu_dynamic_quant" if module.act_scale is None else "npu_quant_matmul"
    return None


def ge_fallbacks(model: nn.Module, backend_fn) -> list:
    """Keep npu ops without a GE converter in this torchair out of the GE graph of ``model``.

    Each torch_npu op the fused modules and INT8 linears of ``model`` use is probed (``ge_probe``);
    the modules whose op cannot be in a GE graph switch to a portable implementation (fused modules:
    the reference formula; ``Int8Linear``: ``dequant`` for W8A16, ``emulate`` for W8A8), and the rest
    of the graph keeps its npu ops. Returns one row per op that fell back, with the reason, for the
    chapter to print.
    """
    users: dict = {}
    for module in model.modules():
        name = _ge_probe_name(module)
        if name is not None:
            users.setdefault(name, []).append(module)
    rows = []
    for name, modules in users.items():
        # an Int8Linear holds buffers only; its activations are in scale_act's dtype
        first = modules[0]
        if hasattr(first, "scale_act"):
            device, dtype = first.scale_act.device, first.scale_act.dtype
        else:
            weight = next(first.parameters())
            device, dtype = weight.device, weight.dtype
        error = ge_probe(name, backend_fn, device, dtype)
        if error is None:
            continue
        reason = (f"no GE converter for it in the torchair of torch_npu {_torch_npu_version()} ({error})")
        now = set()
        for module in modules:
            if hasattr(module, "use_fallback_kernel"):
                now.add(module.use_fallback_kernel(reason))
            else:
                module.impl = "reference"
                now.add("reference")
        now_text = ", ".join(sorted(now))
        ops_text = " + ".join(f"torch_npu.{op}" for op in GE_PROBE_OPS[name] if op != "npu_trans_quant_param")
        rows.append({"op": ops_text, "modules": len(modules), "now": now_text,
                     "reason": f"{reason}; the {now_text} implementation runs inside the graph"})
    return rows


def graph_mode(module, device, compiler_backend=None, **options):
    """``(torch.compile(module, backend=...), backend_name)``: torchair on NPU, inductor elsewhere.

    ``options`` go to ``torch.compile`` (``dynamic``, ``fullgraph``, ...); on NPU ``mode`` goes to
    torchair's ``CompilerConfig.mode`` instead (see ``npu_graph_plan``; ``npu_plan`` passes one already
    made), since torch's ``mode=`` only applies to inductor, and ``options`` other than
    ``guard_filter_fn`` (which torch.compile takes itself) are refused where torchair's backend takes
    none. ``compiler_backend`` (a name such as ``"eager"`` or a callable) replaces the device's
    backend, e.g. to count graphs cheaply in tests.
    """
    kind = _device_kind(device)
    if kind not in ("npu", "cuda", "cpu"):
        raise ValueError(f"device={device!r} is not valid for graph_mode; use npu, cuda or cpu")
    if not versions.has_feature("torch.compile"):
        raise RuntimeError("graph mode needs torch.compile (torch >= 2.0)")
    plan = options.pop("npu_plan", None)
    if compiler_backend is not None:
        options.pop("mode", None)
        name = compiler_backend if isinstance(compiler_backend, str) else getattr(
            compiler_backend, "__name__", type(compiler_backend).__name__)
        return torch.compile(module, backend=compiler_backend, **options), str(name)
    if kind == "npu":
        mode = options.pop("mode", None)
        options.setdefault("dynamic", False)  # GE graphs are built per static shape
        plan = plan if plan is not None else npu_graph_plan(mode)
        npu_backend = npu_graph_backend(plan=plan)
        extra = [k for k in (options.get("options") or {}) if k != "guard_filter_fn"]
        if extra and not backend_takes_options(npu_backend):
            raise ValueError(f"options {', '.join(map(repr, extra))} cannot reach torchair: the backend of torch_npu "
                             f"{plan['torch_npu']} takes no options (torchair's _npu_backend has no **kwargs "
                             "before 7.3.0); leave them out")
        return torch.compile(module, backend=npu_backend, **options), "torchair"
    if kind == "cpu":
        # Wraps each generated C++ kernel in a profiler range, so helpers.profiling can count it.
        options["options"] = {"cpp.enable_kernel_profile": True, **(options.get("options") or {})}
    return torch.compile(module, backend="inductor", **options), "inductor"


_COMPILED: dict = {}


def _compiled(fn: Callable, device) -> Callable:
    """One compiled wrapper per function and device kind, so repeated calls reuse its graphs."""
    key = (fn, _device_kind(device))
    if key not in _COMPILED:
        _COMPILED[key] = graph_mode(fn, device, dynamic=False)[0]
    return _COMPILED[key]


# --- RMSNorm ------------------------------------------------------------------------------------

def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, in float32 then cast back, as LlamaRMSNorm does."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, impl: str = "auto") -> torch.Tensor:
    """RMSNorm over the last dim; ``impl`` in ``RMS_IMPLS`` (see the module docstring)."""
    _check_norm(x, weight, eps)
    impl = resolve_impl(impl, x, "rms_norm")
    if impl == "npu":
        return _npu_op("npu_rms_norm")(x, weight, epsilon=eps)[0]  # returns (y, rstd)
    if impl == "torch":
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    if impl == "compiled":
        return _compiled(rms_norm_reference, x)(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


# --- residual add + RMSNorm -----------------------------------------------------------------------

def add_rms_norm_reference(x, residual, weight, eps: float = 1e-6):
    """(rms_norm(x + residual), x + residual): the add and the norm as separate ops."""
    new_residual = x + residual
    return rms_norm_reference(new_residual, weight, eps), new_residual


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                 impl: str = "auto"):
    """``(normed, new_residual)`` with ``new_residual = x + residual`` feeding the next block.

    On NPU one ``npu_add_rms_norm`` kernel does both; it returns ``(y, rstd, x1 + x2)``.
    """
    _check_norm(x, weight, eps)
    if not isinstance(residual, torch.Tensor) or residual.shape != x.shape:
        shape = tuple(residual.shape) if isinstance(residual, torch.Tensor) else type(residual).__name__
        raise ValueError(f"residual must have the shape of x {tuple(x.shape)}; got {shape}")
    impl = resolve_impl(impl, x, "add_rms_norm")
    if impl == "npu":
        y, _rstd, new_residual = _npu_op("npu_add_rms_norm")(x, residual, weight, eps)
        return y, new_residual
    if impl == "torch":
        new_residual = x + residual
        return F.rms_norm(new_residual, (x.shape[-1],), weight, eps), new_residual
    if impl == "compiled":
        return _compiled(add_rms_norm_reference, x)(x, residual, weight, eps)
    return add_rms_norm_reference(x, residual, weight, eps)


# --- SwiGLU and the FFN ---------------------------------------------------------------------------

def swiglu_reference(gate_up: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """silu(first half) * second half along ``dim`` (npu_swiglu's definition)."""
    gate, up = gate_up.chunk(2, dim=dim)
    return F.silu(gate) * up


def swiglu(gate_up: torch.Tensor, dim: int = -1, impl: str = "auto") -> torch.Tensor:
    """SwiGLU activation of a merged gate_up tensor; ``impl`` in ``SWIGLU_IMPLS``."""
    if not isinstance(gate_up, torch.Tensor) or gate_up.dim() == 0 or gate_up.shape[dim] % 2:
        shape = tuple(gate_up.shape) if isinstance(gate_up, torch.Tensor) else type(gate_up).__name__
        raise ValueError(f"gate_up must have an even size along dim={dim} (gate and up halves); got {shape}")
    impl = resolve_impl(impl, gate_up, "swiglu")
    if impl == "npu":
        return _npu_op("npu_swiglu")(gate_up, dim=dim)
    if impl == "compiled":
        return _compiled(swiglu_reference, gate_up)(gate_up, dim)
    return swiglu_reference(gate_up, dim)


def _check_ffn(x, w_gate, w_up, w_down) -> None:
    """nn.Linear layout: w_gate / w_up are (I, H), w_down is (H, I)."""
    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            raise ValueError(f"{name} must be a 2-D weight in nn.Linear layout (out, in)")
    hidden = x.shape[-1]
    if w_gate.shape != w_up.shape or w_gate.shape[1] != hidden:
        raise ValueError(f"w_gate and w_up must both be (intermediate, hidden) = (I, {hidden}) in nn.Linear "
                         f"(out, in) layout; got w_gate {tuple(w_gate.shape)}, w_up {tuple(w_up.shape)}")
    if w_down.shape != (hidden, w_gate.shape[0]):
        raise ValueError(f"w_down must be (hidden, intermediate) = ({hidden}, {w_gate.shape[0]}); "
                         f"got {tuple(w_down.shape)}")


def ffn_reference(x, w_gate, w_up, w_down) -> torch.Tensor:
    """Llama's FFN as three separate matmuls: down(silu(gate(x)) * up(x)); weights are (out, in)."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def merge_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """One (2I, H) weight, gate rows first, so one matmul yields the halves npu_swiglu expects."""
    return torch.cat([w_gate, w_up], dim=0).contiguous()


def ffn_merged(x, w_gate_up, w_down, impl: str = "reference") -> torch.Tensor:
    """One gate_up matmul, SwiGLU (``impl`` as in ``swiglu``), then down."""
    return F.linear(swiglu(F.linear(x, w_gate_up), impl=impl), w_down)


def make_ffn(w_gate, w_up, w_down, variant: str, device=None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A callable ``f(x)`` for one FFN variant (see ``FFN_VARIANTS``), for timing and profiling.

    * ``unfused``  - gate, up, silu, mul, down as separate ops (the reference);
    * ``merged``   - gate and up weights concatenated: one matmul instead of two;
    * ``fused_act``- merged, plus one fused SwiGLU kernel (``npu_swiglu`` on NPU, a compiled
      silu*mul elsewhere);
    * ``graph``    - the unfused FFN under ``graph_mode`` (torchair / inductor).
    """
    _check_impl(variant, FFN_VARIANTS, "variant")
    device = device if device is not None else w_gate.device
    if variant == "unfused":
        return lambda x: ffn_reference(x, w_gate, w_up, w_down)
    if variant == "graph":
        compiled = graph_mode(ffn_reference, device, dynamic=False)[0]
        return lambda x: compiled(x, w_gate, w_up, w_down)
    w_gate_up = merge_gate_up(w_gate, w_up)
    if variant == "merged":
        return lambda x: ffn_merged(x, w_gate_up, w_down, impl="reference")
    # npu_swiglu where this torch_npu has it (not before torch_npu 2.1.0.post4), else the reference
    act = resolve_impl("auto", device, "swiglu") if _device_kind(device) == "npu" else "compiled"
    return lambda x: ffn_merged(x, w_gate_up, w_down, impl=act)


# --- modules for a loaded Llama -----------------------------------------------------------------

class FusedRMSNorm(nn.Module):
    """Drop-in for ``LlamaRMSNorm`` that dispatches through ``rms_norm``."""

    def __init__(self, weight: torch.Tensor, eps: float, impl: str = "auto"):
        super().__init__()
        _check_impl(impl, RMS_IMPLS)
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.variance_epsilon = eps
        self.impl = impl

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon, impl=self.impl)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, impl={self.impl!r}"


class FusedLlamaMLP(nn.Module):
    """``LlamaMLP`` with gate and up merged into one Linear and a SwiGLU activation."""

    def __init__(self, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear, impl: str = "auto"):
        super().__init__()
        _check_impl(impl, SWIGLU_IMPLS)
        hidden, inter = gate_proj.in_features, gate_proj.out_features
        bias = gate_proj.bias is not None
        ref = gate_proj.weight
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=bias, device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            self.gate_up_proj.weight.copy_(merge_gate_up(gate_proj.weight, up_proj.weight))
            if bias:
                self.gate_up_proj.bias.copy_(torch.cat([gate_proj.bias, up_proj.bias]))
        self.down_proj = down_proj
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_up_proj(x), impl=self.impl))


def _is_rmsnorm(module: nn.Module) -> bool:
    return (type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), torch.Tensor)
            and hasattr(module, "variance_epsilon"))


def _is_silu_mlp(module: nn.Module) -> bool:
    if not all(isinstance(getattr(module, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
        return False
    act = getattr(module, "act_fn", None)
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


def apply_fused_modules(model: nn.Module, impl: str = "auto") -> dict:
    """Replace a loaded Llama's RMSNorm and MLP modules in place; return what was replaced.

    ``impl="auto"`` resolves from the model's device: the torch_npu ops on NPU; ``F.rms_norm`` and
    a merged gate_up matmul on CUDA; on CPU the reference norm (``F.rms_norm`` is no faster there, and
    the reference matches ``LlamaRMSNorm`` bit for bit, so 16-bit logits do not drift) and the merged
    gate_up matmul. ``"reference"`` / ``"compiled"`` / ``"npu"`` force one path (``"torch"`` applies
    to the norms only; MLPs then use the reference SwiGLU). On an NPU, ``auto`` uses a torch_npu op
    only where this torch_npu has it; ``impl_reason`` / ``swiglu_reason`` say what was chosen and why.
    Logits stay equal to the original model's within the dtype's tolerance (tests check this).
    """
    _check_impl(impl, RMS_IMPLS)
    first = next(model.parameters(), None)
    if first is None:
        raise ValueError("model has no parameters; pass a loaded Llama-style model")
    cpu_auto = impl == "auto" and _device_kind(first) == "cpu"
    if cpu_auto:
        impl = "reference"
    norm_impl, norm_reason = explain_impl(impl, first, "rms_norm")
    act_impl, act_reason = explain_impl("reference" if impl == "torch" else impl, first, "swiglu")
    if cpu_auto:
        norm_reason = "auto on cpu: the reference RMSNorm (F.rms_norm is no faster here; it matches LlamaRMSNorm)"
        act_reason = "auto on cpu: the reference silu(gate) * up after the merged gate_up matmul"
    counts = {"rmsnorm": 0, "mlp": 0, "impl": norm_impl, "swiglu_impl": act_impl, "skipped_mlp": 0,
              "impl_reason": norm_reason, "swiglu_reason": act_reason}
    targets = []
    for name, module in model.named_modules():
        if _is_rmsnorm(module):
            targets.append((name, FusedRMSNorm(module.weight, module.variance_epsilon, norm_impl), "rmsnorm"))
        elif all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")):
            if _is_silu_mlp(module):
                fused = FusedLlamaMLP(module.gate_proj, module.up_proj, module.down_proj, act_impl)
                targets.append((name, fused, "mlp"))
            else:
                counts["skipped_mlp"] += 1  # not SiLU-gated: SwiGLU would change the model
    for name, new, kind in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
        counts[kind] += 1
    return counts


# --- bytes moved, for GB/s figures --------------------------------------------------------------

def rms_norm_bytes(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Minimum traffic of one RMSNorm: read x and weight once, write y once."""
    return 2 * x.numel() * x.element_size() + weight.numel() * weight.element_size()


def add_rms_norm_bytes(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Minimum traffic of fused add + RMSNorm: read x and residual, write y and the new residual."""
    return 4 * x.numel() * x.element_size() + weight.numel() * weight.element_size()


def llama_rmsnorm_matches_formula(hidden: int = 64, eps: float = 1e-5) -> dict:
    """Does transformers' ``LlamaRMSNorm`` compute the guide's ``x / sqrt(mean(x^2) + eps) * w``, with
    no bias? Checked on a small float32 tensor with a random weight (chapter 01 records it)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from . import bench

    g = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(hidden, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden, generator=g) + 0.5)
        x = torch.randn(3, hidden, generator=g)
        formula = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * norm.weight
        got = norm(x)
        diff = (got - formula).abs().max().item()
        close = torch.allclose(got, formula, **bench.tolerance_for(torch.float32, "norm", formula))
    has_bias = any("bias" in name for name, _ in norm.named_parameters())
    return {"matches": close and not has_bias, "max_abs_diff": diff, "has_bias": has_bias}


# --- chapter 01: the implementations side by side, each checked before it is timed --------------

def rms_norm_inputs(shape, device, dtype, seed: int = 0):
    """``(x, weight, x_non_contiguous)`` for an RMSNorm check: random x, a random weight near 1 (a
    kernel that ignores the weight fails the check; the guide's ``w = ones`` would hide that), and
    the same values with the hidden dim strided, which is what a transpose upstream leaves."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(device, dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(device, dtype)
    return x, weight, x.mT.contiguous().mT


def rms_norm_variants(x, x_non_contiguous, weight, impls, eps: float = 1e-5) -> list:
    """``bench.check_and_time`` variants: every ``impl`` on the contiguous and the strided input."""
    return [({"impl": impl, "layout": layout}, (lambda inp=inp, impl=impl: rms_norm(inp, weight, eps, impl=impl)))
            for impl in impls for layout, inp in (("contiguous", x), ("non-contiguous", x_non_contiguous))]


def float32_reference(fn: Callable, *args, **kwargs):
    """``fn`` on ``args`` with every floating tensor upcast to float32: the reference a 16-bit
    kernel is checked against (``bench.tolerance_for``), computed from the very same input values,
    so only the kernel's own roundings separate the two."""
    def up(a):
        return a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
    return fn(*map(up, args), **{k: up(v) for k, v in kwargs.items()})


def add_rms_norm_variants(x, weight, impls, eps: float = 1e-5, seed: int = 1):
    """``(variants, expected)`` for residual add + RMSNorm on ``x``'s shape with a random residual;
    ``expected`` is the float32 reference (``float32_reference``)."""
    residual = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(x.device, x.dtype)
    variants = [({"impl": impl}, (lambda impl=impl: add_rms_norm(x, residual, weight, eps, impl=impl)))
                for impl in impls]
    return variants, float32_reference(add_rms_norm_reference, x, residual, weight, eps)


def edge_op_variants(table: torch.Tensor, lm_head: torch.Tensor, prompt_tokens: int, seed: int = 2) -> list:
    """The "odds and ends" of a step: one embedding row, a prompt's rows, and the logits GEMV, each
    with the bytes it must move (a lookup reads a row and writes it; the GEMV reads all of lm_head)."""
    g = torch.Generator().manual_seed(seed)
    vocab, hidden = table.shape
    one = torch.randint(0, vocab, (1, 1), generator=g).to(table.device)
    many = torch.randint(0, vocab, (1, prompt_tokens), generator=g).to(table.device)
    h = torch.randn(1, 1, hidden, generator=g).to(table.device, table.dtype)
    size = table.element_size()
    return [({"op": "embedding, 1 token", "shape": f"ids 1x1, table {vocab}x{hidden}"},
             lambda: F.embedding(one, table), 2 * hidden * size),
            ({"op": f"embedding, {prompt_tokens} tokens", "shape": f"ids 1x{prompt_tokens}, table {vocab}x{hidden}"},
             lambda: F.embedding(many, table), 2 * prompt_tokens * hidden * size),
            ({"op": "lm_head, 1 token", "shape": f"1x{hidden} @ {vocab}x{hidden}^T"},
             lambda: F.linear(h, lm_head), vocab * hidden * size + vocab * size)]


def rmsnorm_guide_bounds(specs, claim_id: str = "C06") -> dict:
    """What the guide's RMSNorm time implies (its claim, not a measurement): the bandwidth its
    0.05-0.1 ms needs on its fp16 (1, 4096, 4096) tensor, and the fastest a 910B1 could be at the
    bandwidth in ``data/device_specs.csv`` (an unofficial figure there)."""
    from .claims import claimed_range, load_claims

    table = load_claims()
    low_ms, high_ms = claimed_range(table[table["id"] == claim_id].iloc[0]["claimed_value"])
    nbytes = 2 * 4096 * 4096 * 2 + 4096 * 2  # fp16: read x, write y, read gamma
    npu = specs[specs["variant"].str.contains("910B1")].iloc[0]
    return {"guide_dtype": "float16", "guide_low_ms": low_ms, "guide_high_ms": high_ms,
            "guide_implied_gbps_low": nbytes / (high_ms / 1e3) / 1e9,
            "guide_implied_gbps_high": nbytes / (low_ms / 1e3) / 1e9,
            "npu_bandwidth_gbps": float(npu["bandwidth_gbps"]), "npu_spec_status": str(npu["status"]),
            "npu_floor_ms": nbytes / (float(npu["bandwidth_gbps"]) * 1e9) * 1e3}


# --- chapter 02: the guide's FFN line, the FFN variants side by side, the guide's precision claims --

GUIDE_FFN_SHAPE = "x 1x4096x4096, w 4096x14336"


def guide_ffn_line() -> dict:
    """The guide's step-3 line ``F.linear(x, w_gate)`` with x (1, 4096, 4096) and its w_gate
    (4096, 14336), run on ``meta`` tensors (shapes are checked as on a device; nothing is allocated),
    beside the corrected (out, in) weight of Llama-2-7B's width, and the widths transformers' config
    defaults give (``LlamaConfig()`` is Llama-2-7B, ``MistralConfig()`` Mistral-7B)."""
    from transformers import LlamaConfig, MistralConfig

    llama, mistral = LlamaConfig(), MistralConfig()
    x = torch.empty(1, 4096, 4096, device="meta", dtype=torch.float16)
    try:
        F.linear(x, torch.empty(4096, 14336, device="meta", dtype=torch.float16))  # the guide's (in, out)
        error = None
    except RuntimeError as exc:
        error = f"{type(exc).__name__}: {exc}"
    fixed = torch.empty(llama.intermediate_size, llama.hidden_size, device="meta", dtype=torch.float16)
    sizes = [{"config defaults": "LlamaConfig() - Llama-2-7B", "hidden": llama.hidden_size,
              "intermediate": llama.intermediate_size},
             {"config defaults": "MistralConfig() - Mistral-7B", "hidden": mistral.hidden_size,
              "intermediate": mistral.intermediate_size}]
    return {"error": error, "runs": error is None, "llama2_7b_intermediate": llama.intermediate_size,
            "corrected_weight": "x".join(map(str, fixed.shape)),
            "corrected_output": "x".join(map(str, F.linear(x, fixed).shape)), "sizes": sizes}


def ffn_variant_names(device, compile_ops: bool) -> list:
    """The ``FFN_VARIANTS`` a run times: ``unfused`` and ``merged`` everywhere; ``fused_act`` where
    its fused SwiGLU needs no compiler (NPU: ``npu_swiglu``) or compiling is allowed; ``graph`` only
    with ``compile_ops``."""
    names = ["unfused", "merged"]
    if compile_ops or _device_kind(device) == "npu":
        names.append("fused_act")
    if compile_ops:
        names.append("graph")
    return names


def ffn_shapes(hidden: int, intermediate: int, model_info: dict) -> dict:
    """``{name: (H, I)}``: the large FFN of the parameters (Llama-2-7B's 4096 x 11008 by default)
    and the loaded model's own (``models.describe_model``)."""
    own = (model_info["hidden_size"], model_info["intermediate_size"])
    return {f"large H={hidden} I={intermediate}": (hidden, intermediate),
            f"{model_info['name']} H={own[0]} I={own[1]}": own}


def ffn_weights(hidden: int, intermediate: int, device, dtype, generator: torch.Generator) -> list:
    """Random ``[w_gate, w_up, w_down]`` in nn.Linear layout with standard deviation 1/sqrt(fan-in),
    so activations have the scale of a real layer."""
    return [(torch.randn(o, n, generator=generator) / n ** 0.5).to(device, dtype)
            for o, n in ((intermediate, hidden), (intermediate, hidden), (hidden, intermediate))]


def ffn_cases(shapes: dict, tokens, device, dtype, seed: int = 0) -> dict:
    """``{"<shape>, T=<t>": (x, weights)}`` for every FFN shape and token count (decode T=1 and the
    prefill), one set of weights per shape."""
    g = torch.Generator().manual_seed(seed)
    cases = {}
    for name, (hidden, intermediate) in shapes.items():
        weights = ffn_weights(hidden, intermediate, device, dtype, g)
        for t in tokens:
            cases[f"{name}, T={t}"] = (torch.randn(1, t, hidden, generator=g).to(device, dtype), weights)
    return cases


def ffn_variants(x: torch.Tensor, weights, names, device, case: str = "") -> list:
    """``bench.check_time_count`` variants: ``make_ffn`` of every name on input ``x``."""
    fns = {name: make_ffn(*weights, name, device) for name in names}
    return [({"case": case, "variant": name}, (lambda f=f: f(x))) for name, f in fns.items()]


def elementwise_share_rows(cases: dict, timings: dict, names, measure: Callable) -> list:
    """How much fusion can buy in each FFN case: the elementwise part alone (``swiglu_reference`` on
    a (1, T, 2I) tensor, timed with ``measure(fn, name)``) as a share of the unfused FFN, the
    variant with the lowest median and its speedup with spread (``clear``: apart from every other
    variant beyond the p10-p90 noise, ``decide.rank``), and each variant's saving in % of the
    unfused median (negative when its median is above the unfused one)."""
    from . import bench, decide

    rows = []
    for case, (x, weights) in cases.items():
        gate_up = torch.randn(1, x.shape[1], 2 * weights[0].shape[0],
                              generator=torch.Generator().manual_seed(4)).to(x.device, x.dtype)
        act = measure(lambda: swiglu_reference(gate_up), f"silu*mul / {case}")
        total = timings[case, "unfused"]
        found = decide.rank([(v, timings[case, v].median, timings[case, v].p10, timings[case, v].p90)
                             for v in names], higher_is_better=False)
        best = bench.speedup(total, timings[case, found.best])
        rows.append({"case": case, "elementwise_ms": act.median_ms, "unfused_ffn_ms": total.median_ms,
                     "elementwise_share_pct": 100 * act.median / total.median,
                     "best_variant": found.best, "best_clear": found.clear, "best_speedup": best.ratio,
                     "best_speedup_low": best.low, "best_speedup_high": best.high,
                     **{f"saved_pct_{v}": 100 * (1 - timings[case, v].median / total.median)
                        for v in names if v != "unfused"}})
    return rows


def ffn_precision(weights, device, variant: str, seed: int = 3) -> tuple:
    """The guide's two precision claims at decode (T=1) in float16, the guide's dtype: ``(rows,
    facts)``. Against a float64 reference computed on the CPU (NPUs have no fp64 matmul): the unfused
    result, the ``variant`` one, and the ``variant`` one with every weight stored transposed (same
    values, column-major, so not contiguous). ``facts`` has each difference, the output's largest
    value, one float16 ulp there (``quant.ulp``: an absolute threshold means little without it),
    and whether the down weight is still non-contiguous where ``F.linear`` reads it (gate and up are
    copied into one contiguous tensor by ``merge_gate_up``)."""
    from .quant import ulp

    g = torch.Generator().manual_seed(seed)
    w64 = [w.to("cpu", torch.float64) for w in weights]
    x64 = torch.randn(1, 1, w64[0].shape[1], generator=g, dtype=torch.float64)
    with torch.inference_mode():
        exact = ffn_reference(x64, *w64)
        w16 = [w.to(device, torch.float16) for w in w64]
        w16_nc = [w.t().contiguous().t() for w in w16]  # same values, column-major storage
        x16 = x64.to(device, torch.float16)
        unfused = make_ffn(*w16, "unfused", device)(x16).cpu()
        fused = make_ffn(*w16, variant, device)(x16).cpu()
        fused_nc = make_ffn(*w16_nc, variant, device)(x16).cpu()

    def diff(a, b):
        return (a.double() - b.double()).abs().max().item()

    out_max = exact.abs().max().item()
    facts = {"fused_vs_unfused": diff(fused, unfused), "unfused_vs_float64": diff(unfused, exact),
             "fused_vs_float64": diff(fused, exact), "noncontig_vs_contig": diff(fused_nc, fused),
             "output_max_abs": out_max, "ulp_at_output": ulp(out_max, torch.float16),
             "weight_contiguous_at_op": w16_nc[2].is_contiguous()}
    facts["fused_vs_unfused_ulps"] = facts["fused_vs_unfused"] / facts["ulp_at_output"]
    rows = [(f"{variant} vs unfused (the guide's comparison)", facts["fused_vs_unfused"], "< 1e-3"),
            ("unfused float16 vs float64", facts["unfused_vs_float64"], ""),
            (f"{variant} float16 vs float64", facts["fused_vs_float64"], ""),
            (f"{variant}, non-contiguous weights vs contiguous", facts["noncontig_vs_contig"],
             "> 1e-2 if misaligned")]
    rows = [{"comparison": c, "max_abs_diff": d, "output max |y|": out_max, "guide threshold": t}
            for c, d, t in rows]
    return rows, facts


def fused_model_check(model: nn.Module, tokens: int, measure: Callable, seed: int = 5) -> dict:
    """``apply_fused_modules`` on a loaded Llama, checked and timed: one prefill forward of
    ``tokens`` random ids before and after (``measure(fn, name)``), the logits compared within a few
    ulps of the dtype (``bench.tolerance_for(dtype, "model")``: both forwards in the working dtype,
    since the question is what fusing changed, and a float32 copy of a 7B model would not fit), the
    next-token argmax agreement, and what was replaced. The model keeps its fused modules."""
    from . import bench

    first = next(model.parameters())
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(seed))
    ids = ids.to(first.device)
    with torch.inference_mode():
        def forward():
            return model(input_ids=ids, use_cache=False)

        before = forward().logits
        t_before = measure(forward, "model forward, original modules")
        counts = apply_fused_modules(model, impl="auto")
        after = forward().logits
        t_after = measure(forward, "model forward, fused modules")
    bench.assert_within(after, before, "model", what="logits with fused modules")
    return {"counts": counts, "before": t_before, "after": t_after,
            "max_abs_diff": (after.float() - before.float()).abs().max().item(),
            "logits_max_abs": before.abs().max().item(),
            "top1_agreement": (after.argmax(-1) == before.argmax(-1)).float().mean().item()}


def residual_norm_cases(prefill_tokens: int, hidden: int, model_hidden: int, device, dtype,
                        seed: int = 6) -> dict:
    """``{case: (x, residual, weight)}`` for residual add + RMSNorm: a prefill of the large FFN's
    width and one decode token of the loaded model's width."""
    g = torch.Generator().manual_seed(seed)
    cases = {}
    for label, (t, h) in {"prefill, large": (prefill_tokens, hidden),
                          "decode, model": (1, model_hidden)}.items():
        x, residual = (torch.randn(1, t, h, generator=g).to(device, dtype) for _ in range(2))
        weight = (1 + 0.1 * torch.randn(h, generator=g)).to(device, dtype)
        cases[f"{label} 1x{t}x{h}"] = (x, residual, weight)
    return cases


def residual_norm_variants(inputs, compiled: Callable, backend_name: str, case: str,
                           eps: float = 1e-5) -> list:
    """``bench.check_time_count`` variants: ``add_rms_norm_reference`` eager, then the same function
    compiled (``graph_mode(add_rms_norm_reference, ...)``), labelled ``graph (<backend>)``."""
    return [({"case": case, "mode": "eager"}, lambda: add_rms_norm_reference(*inputs, eps)),
            ({"case": case, "mode": f"graph ({backend_name})"}, lambda: compiled(*inputs, eps))]
