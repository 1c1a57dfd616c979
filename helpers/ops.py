"""Llama's small operators, each with one plain reference and a fused path per backend (layer:
model and kernels; taught in 01_operator_verification and 02_ffn_fusion).

``01_operator_verification.ipynb`` teaches RMSNorm and residual add + RMSNorm,
``02_ffn_fusion.ipynb`` the SwiGLU FFN and graph mode; later chapters call ``apply_fused_modules`` to
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
``npugraph_ex`` from 26.0.0) and ``ge_support.ge_fallbacks`` keeps a fused op out of a GE graph
where this torchair has no GE converter for it. ``graph_mode`` stays here because ``impl="compiled"``
and the FFN's ``graph`` variant compile through it. Chapters 01 and 02's own tables and checks are
in ``operator_study``.
"""
from __future__ import annotations

import inspect
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import backend, versions
from .params import check_choice

RMS_IMPLS = ("auto", "reference", "npu", "torch", "compiled")
SWIGLU_IMPLS = ("auto", "reference", "npu", "compiled")
# --- argument checks: fail before any work, naming the parameter -----------------------------

def _shape(value) -> "tuple | str":
    """A tensor's shape, or the type of what came instead, for an error message."""
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def _check_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"x must be a tensor with at least one dim; got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight (gamma) must have shape ({x.shape[-1]},) to match the last dim of x "
                         f"{tuple(x.shape)}; got {_shape(weight)}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps={eps!r} is not valid; it must be a number > 0 such as 1e-6")


# The torch_npu op behind each fused operator (versions.TORCH_NPU_OPS says which line has each).
NPU_OPS = {"rms_norm": "npu_rms_norm", "add_rms_norm": "npu_add_rms_norm", "swiglu": "npu_swiglu"}


def _loaded_torch_npu():
    """The torch_npu module this process imported, or None (for messages and ``hasattr`` checks)."""
    return backend.import_torch_npu().module


def resolve_impl(impl: str, device, op: str = "rms_norm") -> str:
    """The implementation that really runs for ``impl`` on ``device`` (``auto`` and fallbacks
    resolved); ``op`` is ``"rms_norm"``, ``"add_rms_norm"`` or ``"swiglu"``."""
    check_choice("impl", impl, SWIGLU_IMPLS if op == "swiglu" else RMS_IMPLS)
    if impl == "auto":
        if backend.device_kind(device) == "npu" and versions.npu_op_missing(NPU_OPS[op], _loaded_torch_npu()) is None:
            return "npu"
        impl = "reference" if op == "swiglu" else "torch"
    if impl == "npu":
        backend.npu_op(NPU_OPS[op])  # an explicit request fails here, naming the op this line lacks
    if impl == "torch" and not versions.has_feature("F.rms_norm"):
        return "reference"  # torch < 2.4 (the 2.1 of older Ascend images) has no F.rms_norm
    return impl


def explain_impl(impl: str, device, op: str = "rms_norm") -> tuple:
    """``(resolve_impl(...), why)``: the implementation that runs and the reason, for a chapter to print."""
    chosen, kind, npu_name = resolve_impl(impl, device, op), backend.device_kind(device), NPU_OPS[op]
    if impl == "auto" and kind == "npu":
        if chosen == "npu":
            version = versions.torch_npu_version(_loaded_torch_npu())
            return chosen, f"auto on an NPU: torch_npu.{npu_name} exists in torch_npu {version}"
        missing = versions.npu_op_missing(npu_name, _loaded_torch_npu())
        return chosen, f"auto on an NPU: {missing}; the {chosen} implementation runs instead"
    if impl == "npu":
        return chosen, f"impl='npu' requested: torch_npu.{npu_name}"
    if impl == "auto":
        why = f"auto on {kind}: torch_npu.{npu_name} is an NPU op"
        return chosen, why + ("; F.rms_norm" if chosen == "torch" else "; the reference formula")
    if chosen != impl:
        return chosen, f"impl={impl!r} requested; this torch has no F.rms_norm (torch >= 2.4), so the reference runs"
    return chosen, f"impl={impl!r} requested"


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
    version = versions.torch_npu_version(_loaded_torch_npu())
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
        ge = mode == "max-autotune"
        plan.update(mode_set=mode, graph="GE" if ge else "aclgraph", reason=f"CompilerConfig.mode = {mode!r}: "
                    + ("the whole graph to GE" if ge else "aclgraph capture and replay"))
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


def graph_mode(module, device, compiler_backend=None, **options):
    """``(torch.compile(module, backend=...), backend_name)``: torchair on NPU, inductor elsewhere.

    ``options`` go to ``torch.compile`` (``dynamic``, ``fullgraph``, ...); on NPU ``mode`` goes to
    torchair's ``CompilerConfig.mode`` instead (see ``npu_graph_plan``; ``npu_plan`` passes one already
    made), since torch's ``mode=`` only applies to inductor, and ``options`` other than
    ``guard_filter_fn`` (which torch.compile takes itself) are refused where torchair's backend takes
    none. ``compiler_backend`` (a name such as ``"eager"`` or a callable) replaces the device's
    backend, e.g. to count graphs cheaply in tests.
    """
    kind = backend.device_kind(device)
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
    key = (fn, backend.device_kind(device))
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
        return backend.npu_op("npu_rms_norm")(x, weight, epsilon=eps)[0]  # returns (y, rstd)
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
        raise ValueError(f"residual must have the shape of x {tuple(x.shape)}; got {_shape(residual)}")
    impl = resolve_impl(impl, x, "add_rms_norm")
    if impl == "npu":
        y, _rstd, new_residual = backend.npu_op("npu_add_rms_norm")(x, residual, weight, eps)
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
        raise ValueError(f"gate_up must have an even size along dim={dim} (gate and up halves); got {_shape(gate_up)}")
    impl = resolve_impl(impl, gate_up, "swiglu")
    if impl == "npu":
        return backend.npu_op("npu_swiglu")(gate_up, dim=dim)
    if impl == "compiled":
        return _compiled(swiglu_reference, gate_up)(gate_up, dim)
    return swiglu_reference(gate_up, dim)


def merge_gate_up(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """One (2I, H) weight, gate rows first, so one matmul yields the halves npu_swiglu expects."""
    return torch.cat([w_gate, w_up], dim=0).contiguous()


# --- modules for a loaded Llama -----------------------------------------------------------------

class FusedRMSNorm(nn.Module):
    """Drop-in for ``LlamaRMSNorm`` that dispatches through ``rms_norm``."""

    def __init__(self, weight: torch.Tensor, eps: float, impl: str = "auto"):
        super().__init__()
        check_choice("impl", impl, RMS_IMPLS)
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
        check_choice("impl", impl, SWIGLU_IMPLS)
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
    check_choice("impl", impl, RMS_IMPLS)
    first = next(model.parameters(), None)
    if first is None:
        raise ValueError("model has no parameters; pass a loaded Llama-style model")
    cpu_auto = impl == "auto" and backend.device_kind(first) == "cpu"
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


# --- the reference a 16-bit kernel is checked against --------------------------------------------

def float32_reference(fn: Callable, *args, **kwargs):
    """``fn`` on ``args`` with every floating tensor upcast to float32: the reference a 16-bit
    kernel is checked against (``bench.tolerance_for``), computed from the very same input values,
    so only the kernel's own roundings separate the two."""
    def up(a):
        return a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
    return fn(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
