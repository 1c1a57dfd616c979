"""Which torch_npu ops can sit inside a GE graph on this torchair, and the fallbacks for those that
cannot (layer: model and kernels; taught in 00_environment_check, whose line report probes each op,
and 06_optimization_ladder, whose graph rung follows the fused and INT8 rungs).

An op needs a GE converter in torchair to be inside a GE graph, and which ops have one depends on
the torchair version; ``ge_probe`` compiles each op alone to find out, and ``ge_fallbacks`` switches
the fused modules (``ops``) and INT8 linears (``quant``) whose op has none to a portable kernel
before a model is compiled. Building a graph itself is ``ops.graph_mode``: the kernels' own
``impl="compiled"`` goes through it, so it sits below this module.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import backend, ops, quant, versions

# What each GE probe puts into a graph: the fused ops alone, the INT8 ops as an ``Int8Linear`` of
# quant calls them (W8A16; dynamic W8A8 = npu_dynamic_quant + npu_quant_matmul with a per-token
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
    if type(module) is ops.FusedRMSNorm and module.impl == "npu":
        return "npu_rms_norm"
    if type(module) is ops.FusedLlamaMLP and module.impl == "npu":
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
        like = first.scale_act if hasattr(first, "scale_act") else next(first.parameters())
        error = ge_probe(name, backend_fn, like.device, like.dtype)
        if error is None:
            continue
        version = versions.torch_npu_version(backend.import_torch_npu().module)
        reason = f"no GE converter for it in the torchair of torch_npu {version} ({error})"
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
