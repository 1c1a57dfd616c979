"""INT8 linears per backend, calibration and library baselines (layer: model and kernels; taught in
05_int8_quantization).

One module, ``Int8Linear``, holds a symmetric
per-output-channel int8 weight and picks a kernel per backend:

* ``npu``: ``torch_npu.npu_weight_quant_batchmatmul`` (W8A16; the (N, K) weight passed as its
  transposed (K, N) view, the layout the docs recommend per channel, and the scale in the activation
  dtype, cast once), or ``npu_dynamic_quant`` + ``npu_quant_matmul`` for W8A8 (``output_dtype``
  always given; a static activation scale is folded into an int64 ``npu_trans_quant_param`` scale
  for float16 output, which GE graph mode needs). These ops take only float16 / bfloat16
  activations, so float32 never reaches them, and each is used only where this torch_npu has it
  (``npu_int8_choice``). They take K and N up to 65,535 only, so a wider linear (``lm_head`` of a
  128K vocabulary) stays dense and ``quantize_model_int8`` names it in ``kept_dense``;
* ``int8pack``: ``torch._weight_int8pack_mm`` (CPU, and CUDA where torch has it) with 16-bit
  activations. Fed float32 activations it is several times slower (pathologically so for more
  than one row), so W8A16 on a CPU always runs with 16-bit activations: a float32 model's
  activations are cast to bfloat16 at each int8 linear and the output cast back (``act_dtype``);
* ``dequant``: cast the int8 weight to the activation dtype inside ``forward`` (any device;
  the fallback when ``_weight_int8pack_mm`` is missing; torchao's weight-only eager math);
* ``emulate``: W8A8 with exact integer arithmetic on CPU, for quality only (not a speed path).

On a CPU ``quantize_model_int8(impl="auto")`` picks the W8A16 kernel by timing, at the model's own
shapes, ``_weight_int8pack_mm``, the dequant math and torchao's weight-only path
(``time_w8a16_kernels``, ``pick_w8a16_kernel``); chapter 06 compiles the result, where inductor's
max-autotune times its own C++ int8 GEMM against ATen's ``_weight_int8pack_mm`` per shape.
"""
from __future__ import annotations

import gc
import logging
import warnings
from contextlib import contextmanager
from typing import Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import backend, bench, versions
from .prose import message
from .models import weight_bytes
from .quality import perplexity  # noqa: F401  (part of this module's public API)

IMPLS = ("auto", "npu", "int8pack", "dequant", "emulate")
SCHEMES = ("w8a16", "w8a8")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT8PACK = "torch._weight_int8pack_mm"


# --- the math: symmetric per-channel weights, per-token or static activations ---------------

def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> (int8 (N, K), float32 scale (N,)); w ≈ q * scale[:, None].

    Symmetric, one scale per output channel, range [-127, 127] so that -w quantizes to -q.
    """
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got {tuple(weight.shape)}")
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (q.float() * scale.float()[:, None]).to(dtype)


def dequant_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ (q * scale[:, None]).T`` with the int8 weight cast to ``x``'s dtype in the call (the
    ``dequant`` kernel; ``scale`` in ``x``'s dtype).

    The cheap order, ``linear(x, q) * scale``, skips a pass over the weight but its product is up to
    127 / max|w| times the real output before the scale brings it back: float16 stops at 65504, so
    an activation in the thousands (SmolLM2-135M's down_proj inputs reach that on ordinary text)
    times a few int8 weights near 127 is already inf, and the logits turn NaN. float16 therefore scales the weight
    first, which keeps every intermediate within the dense model's own range; bfloat16 and float32
    have float32's range and keep the cheap order.
    """
    if x.dtype == torch.float16:
        return F.linear(x, q.to(x.dtype) * scale[:, None])
    return F.linear(x, q.to(x.dtype)) * scale


def quantize_activations(x: torch.Tensor, scale: Optional[float] = None):
    """Rows of ``x`` (M, K) -> (int8 (M, K), float32 scale (M,)): per token (dynamic) without
    ``scale``; with one calibrated ``scale``, values beyond the calibrated range are clipped."""
    x32 = x.float()
    if scale is None:
        rows = x32.abs().amax(dim=-1).clamp(min=1e-8) / 127.0
    else:
        rows = torch.full((x.shape[0],), scale, device=x.device)
    return torch.round(x32 / rows[:, None]).clamp(-128, 127).to(torch.int8), rows


# --- which kernel runs -----------------------------------------------------------------------

# The torch_npu ops each NPU scheme needs: checked with hasattr on the installed torch_npu (the INT8
# ops arrive with torch_npu 2.1.0.post4, npu_dynamic_quant with 2.1.0.post6; versions.TORCH_NPU_OPS).
NPU_INT8_OPS = {
    "w8a16": ("npu_weight_quant_batchmatmul",),
    "w8a8": ("npu_dynamic_quant", "npu_quant_matmul"),
    "w8a8_static": ("npu_quant_matmul", "npu_trans_quant_param"),
}
NPU_ACT_DTYPES = (torch.float16, torch.bfloat16)
# The largest K (in_features) and N (out_features) the NPU INT8 kernels take: "K and N in [1, 65535]"
# for npu_weight_quant_batchmatmul and "the last dims of x1 and x2 must not exceed 65535" for
# npu_quant_matmul (op-plugin 7.2.0 docs/context/torch_npu-npu_weight_quant_batchmatmul.md and
# torch_npu-npu_quant_matmul.md, 约束说明). A limit of these kernels only: int8pack / dequant / emulate
# have none, so it applies where the chosen kernel is "npu". A vocabulary above it (Llama-3's
# 128,256, Qwen2's 151,936) makes lm_head too wide: quantize_model_int8 keeps such a linear dense.
NPU_INT8_MAX_DIM = 65535
NPU_INT8_KERNEL = {"w8a16": "npu_weight_quant_batchmatmul", "w8a8": "npu_quant_matmul"}


def _check_choice(impl: str, scheme: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is not valid; choose one of {', '.join(IMPLS)}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r} is not valid; choose one of {', '.join(SCHEMES)}")


def choose_impl(impl: str, device, dtype: torch.dtype, scheme: str = "w8a16",
                static: bool = False) -> tuple[str, str]:
    """``(kernel, why)``: the concrete kernel for ``impl`` on this device and activation dtype."""
    _check_choice(impl, scheme)
    kind = backend.as_device(device).type
    if impl == "npu" or (impl == "auto" and kind == "npu"):
        return npu_int8_choice(impl, dtype, scheme, static)  # raises for impl="npu" it cannot run
    why = f"impl={impl!r} on {kind}"
    if impl != "auto":
        if scheme == "w8a8" and impl != "emulate":
            raise ValueError(f"impl={impl!r} does not do W8A8; use impl='npu' or 'emulate'")
        if scheme == "w8a16" and impl == "emulate":
            raise ValueError("impl='emulate' is for scheme='w8a8'; W8A16 uses npu, int8pack or dequant")
        if impl == "int8pack" and not versions.has_feature(INT8PACK):
            raise ValueError("impl='int8pack' needs torch._weight_int8pack_mm, which this torch "
                             "lacks; use impl='dequant' or 'auto'")
        return impl, why
    if scheme == "w8a8":
        return "emulate", why
    # on a CPU float32 models included: their activations are cast (act_dtype_for)
    if versions.has_feature(INT8PACK) and (kind == "cpu" or dtype in NPU_ACT_DTYPES):
        return "int8pack", why
    return "dequant", why


def resolve_impl(impl: str, device, dtype: torch.dtype, scheme: str = "w8a16") -> str:
    """The concrete kernel for ``impl`` on this device and activation dtype (``choose_impl``)."""
    return choose_impl(impl, device, dtype, scheme)[0]


def npu_int8_choice(impl: str, dtype: torch.dtype, scheme: str = "w8a16", static: bool = False) -> tuple:
    """``(kernel, why)`` for INT8 on an NPU: ``"npu"`` where this torch_npu has the scheme's ops and
    the activations are float16 / bfloat16 (all these ops accept; op-plugin docs), otherwise the
    fallback (``dequant`` for W8A16, ``emulate`` for W8A8) with the reason. ``impl="npu"`` turns a
    float32 dtype or a missing op into an error naming it instead of falling back."""
    ops_needed = NPU_INT8_OPS["w8a8_static" if scheme == "w8a8" and static else scheme]
    fallback = "dequant" if scheme == "w8a16" else "emulate"
    names = " + ".join(f"torch_npu.{name}" for name in ops_needed)
    if dtype not in NPU_ACT_DTYPES:
        if impl == "npu":
            raise ValueError(f"dtype={backend.dtype_name(dtype)} is not valid for impl='npu': {names} take float16 "
                             "or bfloat16 activations only; load the model with dtype=float16 (or bfloat16)")
        return fallback, (f"{backend.dtype_name(dtype)} activations: {names} take float16 or bfloat16 only, so "
                          f"the {fallback} kernel runs; load the model with dtype=float16 to use them")
    torch_npu = backend.import_torch_npu().module
    if missing := [m for m in (versions.npu_op_missing(name, torch_npu) for name in ops_needed) if m]:
        if impl == "npu":
            raise ValueError(f"impl='npu' for {scheme} needs {names}, but {'; '.join(missing)}; use impl='auto' "
                             "to fall back")
        return fallback, f"{'; '.join(missing)}: the {fallback} kernel runs instead"
    return "npu", f"{names} with {backend.dtype_name(dtype)} activations" + (
        "" if impl == "npu" else " (auto on an NPU: this torch_npu has them)")


def npu_shape_problem(in_features: int, out_features: int, scheme: str = "w8a16") -> Optional[str]:
    """None where the NPU INT8 kernel of ``scheme`` takes a (out_features, in_features) linear;
    otherwise why not, e.g. ``"N=128256 > 65535, the limit of npu_weight_quant_batchmatmul"``."""
    over = [f"{axis}={size} > {NPU_INT8_MAX_DIM}" for axis, size in (("K", in_features), ("N", out_features))
            if size > NPU_INT8_MAX_DIM]
    return f"{', '.join(over)}, the limit of {NPU_INT8_KERNEL[scheme]}" if over else None


def act_dtype_for(impl: str, device, dtype: torch.dtype, scheme: str = "w8a16") -> torch.dtype:
    """The activation dtype an ``Int8Linear`` computes in: the model's, except W8A16 on a CPU in a
    float32 model, which casts to bfloat16 (float32's range) at the linear."""
    if scheme == "w8a16" and impl in ("int8pack", "dequant") and dtype == torch.float32 and \
            backend.as_device(device).type == "cpu":
        return torch.bfloat16
    return dtype


def activations_label(act_dtype: torch.dtype, model_dtype: torch.dtype) -> str:
    """What ``quantize_model_int8`` returns as ``activations``: the dtype, and the cast if any."""
    name = backend.dtype_name(act_dtype)
    return name if act_dtype == model_dtype else message(
        "{dtype} (cast from {model_dtype} at each quantized linear, output cast back)", dtype=name,
        model_dtype=backend.dtype_name(model_dtype))


# --- the modules -----------------------------------------------------------------------------

class _QuantizedLinear(nn.Module):
    """What ``Int8Linear`` and ``Int4Linear`` share: the shapes, the bias, and a ``forward`` that
    flattens the leading dimensions around the 2-D kernel (``_matmul``)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.model_dtype = linear.weight.dtype
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(),
                                                                   requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self._matmul(x.reshape(-1, shape[-1]))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)


class Int8Linear(_QuantizedLinear):
    """A drop-in ``nn.Linear`` replacement with an int8 weight and a per-output-channel scale.

    ``scheme="w8a16"`` keeps activations in the model dtype; ``"w8a8"`` quantizes them too,
    per token at run time (``act_scale=None``) or with a calibrated static scale.
    """

    def __init__(self, linear: nn.Linear, impl: str = "auto", scheme: str = "w8a16",
                 act_scale: Optional[float] = None):
        super().__init__(linear)
        weight = linear.weight
        self.scheme, self.act_scale = scheme, act_scale
        self.impl, self.impl_reason = choose_impl(impl, weight.device, weight.dtype, scheme,
                                                  static=act_scale is not None)
        if self.impl == "npu" and (problem := npu_shape_problem(self.in_features, self.out_features, scheme)):
            # aclnn would reject it at the first call; say so here, with what to do instead
            raise ValueError(f"this linear ({self.out_features} x {self.in_features}) cannot use the NPU INT8 "
                             f"kernel: {problem}; keep it dense (quantize_model_int8 does) or use "
                             "impl='dequant'")
        self.act_dtype = act_dtype_for(self.impl, weight.device, weight.dtype, scheme)
        q, scale = quantize_weight(weight)
        if self.impl == "npu" and scheme == "w8a8":
            q = q.t().contiguous()  # W8A8: a contiguous (K, N) x2, as the docs' examples pass it
        # W8A16 keeps the (N, K) tensor, passed as its .t() view: for per-channel scales the docs
        # recommend that transposed input over a (K, N) copy (op-plugin 7.2.0
        # docs/context/torch_npu-npu_weight_quant_batchmatmul.md, weight).
        self.register_buffer("qweight", q.to(weight.device))
        self.register_buffer("scale", scale.to(weight.device))
        # int8pack and the NPU's W8A16 want the scale in the activation dtype; cast once, here.
        self.register_buffer("scale_act", scale.to(device=weight.device, dtype=self.act_dtype),
                             persistent=False)
        if self.impl == "npu" and scheme == "w8a8":
            self.register_buffer("npu_scale", _npu_w8a8_scale(self.scale, weight.dtype, act_scale), persistent=False)

    def use_fallback_kernel(self, reason: str) -> str:
        """Leave the NPU kernel for the portable one of this scheme (``dequant`` for W8A16, ``emulate``
        for W8A8), e.g. where this torchair cannot put the npu op into a GE graph
        (``ge_support.ge_fallbacks``); returns the kernel that runs now."""
        if self.impl != "npu":
            return self.impl
        if self.scheme == "w8a8":
            self.qweight = self.qweight.t().contiguous()  # back to the (N, K) layout emulate reads
            self.impl = "emulate"
        else:
            self.impl = "dequant"  # reads the same (N, K) int8 weight, scale in the model dtype
        self.impl_reason = reason
        return self.impl

    def extra_repr(self) -> str:
        act = "" if self.scheme == "w8a16" else (
            ", act=dynamic per-token" if self.act_scale is None else f", act=static {self.act_scale:.3g}")
        if self.scheme == "w8a16" and self.act_dtype != self.model_dtype:
            act = f", activations={backend.dtype_name(self.act_dtype)}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"scheme={self.scheme}, impl={self.impl}{act}")

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "npu":
            if x.dtype != self.scale_act.dtype:
                raise ValueError(
                    f"x is {backend.dtype_name(x.dtype)} but this NPU Int8Linear was quantized for "
                    f"{backend.dtype_name(self.scale_act.dtype)} activations (the npu INT8 ops take float16 or "
                    "bfloat16, with the scale in that dtype); quantize the model in the dtype it runs in")
            return self._npu(x)
        if self.scheme == "w8a8":
            xq, token_scale = quantize_activations(x, self.act_scale)
            acc = _int8_matmul(xq, self.qweight).float()
            return (acc * self.scale[None, :] * token_scale[:, None]).to(x.dtype)
        work = x if x.dtype == self.act_dtype else x.to(self.act_dtype)
        scale = self.scale_act if self.scale_act.dtype == work.dtype else self.scale.to(work.dtype)
        if self.impl == "int8pack":
            y = torch._weight_int8pack_mm(work, self.qweight, scale)
        else:
            y = dequant_matmul(work, self.qweight, scale)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def _npu(self, x: torch.Tensor) -> torch.Tensor:
        """``output_dtype`` always given: ``npu_quant_matmul`` defaults to int8."""
        npu = backend.torch_npu_module()
        if self.scheme == "w8a16":
            # the (N, K) weight viewed as (K, N): the per-channel layout the docs recommend
            return npu.npu_weight_quant_batchmatmul(x, self.qweight.t(), antiquant_scale=self.scale_act)
        if self.act_scale is None:
            xq, token_scale = npu.npu_dynamic_quant(x)
            return npu.npu_quant_matmul(xq, self.qweight, self.npu_scale, pertoken_scale=token_scale,
                                        output_dtype=x.dtype)
        xq = quantize_activations(x, self.act_scale)[0]
        return npu.npu_quant_matmul(xq, self.qweight, self.npu_scale, output_dtype=x.dtype)


def _int8_matmul(a: torch.Tensor, b_nk: torch.Tensor) -> torch.Tensor:
    """Exact int8 (M, K) @ int8 (N, K).T -> int32 (M, N)."""
    if hasattr(torch, "_int_mm") and a.device.type == "cpu":
        return torch._int_mm(a, b_nk.t())
    return a.to(torch.int32) @ b_nk.t().to(torch.int32)


def _npu_w8a8_scale(scale: torch.Tensor, dtype: torch.dtype, act_scale: Optional[float]) -> torch.Tensor:
    """The ``scale`` npu_quant_matmul gets, made once at quantization time, from the docs' table of
    dtype combinations (op-plugin 7.2.0 docs/context/torch_npu-npu_quant_matmul.md, 表2):

    * bfloat16 output: a bfloat16 scale (float32 or bfloat16 are allowed, with or without pertoken);
    * float16 output with ``pertoken_scale`` (dynamic W8A8): float32;
    * float16 output without it (static W8A8): in graph mode a float32 scale is refused, so the int64
      form from ``npu_trans_quant_param`` (the static activation scale folded in).
    """
    if act_scale is not None:
        scale = scale * act_scale
    if dtype == torch.bfloat16:
        return scale.to(torch.bfloat16)
    if act_scale is None:
        return scale.float()
    return backend.torch_npu_module().npu_trans_quant_param(scale.float().contiguous())


# --- whole models --------------------------------------------------------------------------

def linear_names(model: nn.Module, skip: Iterable[str] = ()) -> list[str]:
    skip = tuple(skip)
    return [name for name, mod in model.named_modules()
            if isinstance(mod, nn.Linear) and not any(name == s or name.endswith("." + s) for s in skip)]


def check_model(model: nn.Module, skip: Iterable[str] = ()) -> list[str]:
    names = linear_names(model, skip)
    if not names:
        raise ValueError("model has no nn.Linear layers to quantize (already quantized, or not a "
                         "transformer made of nn.Linear modules)")
    bad = {str(model.get_submodule(n).weight.dtype) for n in names
           if model.get_submodule(n).weight.dtype not in FLOAT_DTYPES}
    if bad:
        raise ValueError(f"model dtype {', '.join(sorted(bad))} is not supported for INT8 "
                         "quantization; load the model in float32, float16 or bfloat16")
    return names


def replace_linears(model: nn.Module, names: Iterable[str], make) -> list[nn.Module]:
    """Swap each named ``nn.Linear`` for ``make(name, linear)`` in place; returns the new modules."""
    made = []
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        made.append(make(name, getattr(parent, child)))
        setattr(parent, child, made[-1])
    gc.collect()
    return made


def quantize_model_int8(model: nn.Module, impl: str = "auto", scheme: str = "w8a16", *,
                        act_scales: Optional[dict] = None, skip: Iterable[str] = ()) -> dict:
    """Replace every ``nn.Linear`` of ``model`` (in place) by an ``Int8Linear``.

    ``act_scales`` (from ``calibrate``) makes W8A8 static; without it W8A8 is dynamic per-token.
    Returns ``bytes_before``, ``bytes_after`` (``weight_bytes``), ``layers``, ``impl``, ``scheme``
    and ``kept_dense``: ``[(name, reason), ...]``, the linears left as they were because the chosen
    kernel cannot take their shape (on an NPU, K or N above ``NPU_INT8_MAX_DIM``: ``lm_head`` of a
    vocabulary above 65,535); ``layers`` counts only the quantized ones.
    """
    _check_choice(impl, scheme)
    if act_scales is not None and scheme != "w8a8":
        raise ValueError("act_scales only applies to scheme='w8a8'")
    names = check_model(model, skip)
    if act_scales is not None and (missing := [n for n in names if n not in act_scales]):
        raise ValueError(f"act_scales has no scale for {len(missing)} layers, e.g. {missing[0]!r}; "
                         "calibrate the same model before quantizing")
    before = weight_bytes(model)
    timed: dict = {}
    if impl == "auto" and scheme == "w8a16" and \
            backend.as_device(model.get_submodule(names[0]).weight.device).type == "cpu":
        # On a CPU the kernel is chosen by timing the candidates on this model's own int8 weights.
        timed = choose_cpu_w8a16_kernel(model, skip)
        timed = {"kernel_timings": timed["rows"], "kernel_choice": timed["decision"]}
        if timed["kernel_choice"]["kernel"] == "torchao":
            return {**torchao_int8_weight_only(model), "kept_dense": [], **timed}
        impl = timed["kernel_choice"]["kernel"]
    scales = {} if act_scales is None else {n: float(act_scales[n]) / 127.0 for n in names}
    kept_dense = []
    for name in names:
        lin = model.get_submodule(name)
        kernel = choose_impl(impl, lin.weight.device, lin.weight.dtype, scheme, static=name in scales)[0]
        problem = npu_shape_problem(lin.in_features, lin.out_features, scheme) if kernel == "npu" else None
        if problem:
            kept_dense.append((name, problem))
    if len(kept_dense) == len(names):
        raise ValueError(f"no linear of this model fits the NPU INT8 kernel: {kept_dense[0][1]}")
    dense = {n for n, _ in kept_dense}
    names = [n for n in names if n not in dense]
    made = replace_linears(model, names, lambda n, lin: Int8Linear(lin, impl, scheme, scales.get(n)))
    acts = ({"dynamic per-token int8" if act_scales is None else "static per-tensor int8 (calibrated)"}
            if scheme == "w8a8" else {activations_label(m.act_dtype, m.model_dtype) for m in made})
    return {"bytes_before": before, "bytes_after": weight_bytes(model), "layers": len(names),
            "impl": ",".join(sorted({m.impl for m in made})),
            "impl_reason": "; ".join(sorted({m.impl_reason for m in made})), "scheme": scheme,
            # one label is kept as it is (a message stays one: a page says it in its language)
            "activations": message("{parts}", parts=sorted(acts)) if len(acts) > 1 else next(iter(acts), ""),
            "kept_dense": kept_dense, **timed}


# --- INT4 weights in groups (CPU): the grid of the embedded GGUF's Q4_1 --------------------------

INT4_GROUP = 32  # Q4_1's block: 32 weights share one scale and one minimum


def quantize_weight_int4(weight: torch.Tensor, group_size: int = INT4_GROUP):
    """(N, K) float weight -> (q int32 (N, K) in 0..15, scale (N, K/g), zero (N, K/g)), asymmetric per group.

    torch's int4 kernels compute ``w = (q - 8) * scale + zero``; with ``scale = (max - min) / 15``
    and ``zero = min + 8 * scale`` that is ``q * scale + min``, which is exactly llama.cpp's Q4_1
    (``q * d + m`` over blocks of 32). Weights that came from a Q4_1 GGUF are therefore represented
    up to the rounding of scale and zero to bfloat16.
    """
    if weight.dim() != 2 or weight.shape[1] % group_size:
        raise ValueError(f"weight must be 2-D with in_features divisible by group_size={group_size}, "
                         f"got {tuple(weight.shape)}")
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)
    low, high = w.amin(-1), w.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-8)
    q = torch.round((w - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
    return q, scale, low + 8 * scale


def dequantize_weight_int4(q, scale, zero, group_size: int = INT4_GROUP, dtype=torch.float32):
    n, k = q.shape
    qg = q.reshape(n, k // group_size, group_size).float()
    return ((qg - 8) * scale[..., None] + zero[..., None]).reshape(n, k).to(dtype)


INT4_ACT_DTYPES = (torch.bfloat16, torch.float16)  # the 16-bit activations _weight_int4pack_mm_for_cpu takes


def int4_problem(device) -> Optional[str]:
    """None where the grouped INT4 kernel runs, else why not (it is torch's CPU kernel)."""
    if backend.as_device(device).type != "cpu":
        return "INT4 here is torch's CPU kernel (_weight_int4pack_mm_for_cpu)"
    if not hasattr(torch, "_weight_int4pack_mm_for_cpu") or not hasattr(torch, "_convert_weight_to_int4pack_for_cpu"):
        return "this torch has no _weight_int4pack_mm_for_cpu"
    return None


class Int4Linear(_QuantizedLinear):
    """Weight-only INT4, ``group_size`` weights per scale and zero, ``torch._weight_int4pack_mm_for_cpu``.

    Activations are bfloat16 (a float32 model's are cast at the linear, the output cast back).
    """

    def __init__(self, linear: nn.Linear, group_size: int = INT4_GROUP, act_dtype: torch.dtype = torch.bfloat16):
        if problem := int4_problem(linear.weight.device):
            raise ValueError(problem)
        if act_dtype not in INT4_ACT_DTYPES:
            raise ValueError(f"act_dtype={act_dtype!r} is not valid for the INT4 kernel; choose from "
                             + ", ".join(backend.dtype_name(d) for d in INT4_ACT_DTYPES))
        super().__init__(linear)
        self.group_size, self.act_dtype = group_size, act_dtype
        q, scale, zero = quantize_weight_int4(linear.weight, group_size)
        self.register_buffer("qweight", torch._convert_weight_to_int4pack_for_cpu(q, 8))
        # (K / group, N, 2): scale and zero per group and output channel, the kernel's layout
        self.register_buffer("scales_and_zeros",
                             torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(self.act_dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, activations={backend.dtype_name(self.act_dtype)}")

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x.to(self.act_dtype), self.qweight, self.group_size,
                                                 self.scales_and_zeros).to(x.dtype)


# --- the CPU W8A16 kernel, chosen by timing at the model's shapes -----------------------------

W8A16_CPU_KERNELS = ("int8pack", "dequant", "torchao")
KERNEL_BUDGET_BYTES = 512 * 2**20  # int8 weights timed per candidate; a bigger model is sampled
_KERNEL_CHOICES: dict = {}


def shape_groups(model: nn.Module, skip: Iterable[str] = ()) -> dict:
    """``{(out, in): [weight, ...]}`` of the model's linears: one decode step reads each once."""
    groups: dict = {}
    for name in linear_names(model, skip):
        w = model.get_submodule(name).weight.detach()
        groups.setdefault(tuple(w.shape), []).append(w)
    return groups


def _sample(groups: dict) -> tuple:
    """``(model_dtype, weights, sampled, stretch)`` of ``shape_groups``: a shape above ``KERNEL_BUDGET_BYTES``
    is timed on its first weights, each sampled weight standing for its share of the whole count of layers."""
    weights = sum(len(ws) * s[0] * s[1] for s, ws in groups.items())
    keep = max(1e-9, min(1.0, KERNEL_BUDGET_BYTES / max(weights, 1)))
    sampled = [(shape, w) for shape, ws in groups.items() for w in ws[:max(1, int(round(len(ws) * keep)))]]
    return next(iter(groups.values()))[0].dtype, weights, sampled, sum(len(ws) for ws in groups.values()) / len(sampled)


def time_w8a16_kernels(model: nn.Module, skip: Iterable[str] = (), *, kernels=W8A16_CPU_KERNELS,
                       min_iters: int = 5, min_seconds: float = 0.1) -> list[dict]:
    """One batch-1 decode step's linears, every candidate kernel on the model's own int8 weights.

    Rows: ``dense`` (the model's 16-bit or float32 linears as they are, the baseline INT8 builds on)
    and each of ``kernels``, with the step's ms (median, p10, p90), the weight bytes read and the
    GB/s. Activations are 16-bit (``act_dtype_for``). A shape with more weights than
    ``KERNEL_BUDGET_BYTES`` allows is timed on its first ones and scaled by the count.
    """
    if unknown := [k for k in kernels if k not in W8A16_CPU_KERNELS]:
        raise ValueError(f"kernels contains {unknown[0]!r}; choose from {', '.join(W8A16_CPU_KERNELS)}")
    groups = shape_groups(model, skip)
    model_dtype, weights, sampled, stretch = _sample(groups)
    act = act_dtype_for("int8pack", "cpu", model_dtype)
    x_act = {s: torch.full((1, s[1]), 0.5, dtype=act) for s in groups}
    x_model = {s: torch.full((1, s[1]), 0.5, dtype=model_dtype) for s in groups}
    quantized = [(s, q, sc.to(act), sc) for s, w in sampled for q, sc in [quantize_weight(w)]]
    dense_name = backend.dtype_name(model_dtype)
    label = (backend.dtype_name(act) if act == model_dtype else
             message("{dtype} (cast from {model_dtype})", dtype=backend.dtype_name(act), model_dtype=dense_name))
    problems = {"int8pack": None if versions.has_feature(INT8PACK) else
                message("torch._weight_int8pack_mm is missing in this torch"), "dequant": None}
    mods = []
    if act != model_dtype:
        problems["torchao"] = message("torchao's weight-only path keeps the model's float32 activations "
                                      "(W8A32), not W8A16")
    elif act == torch.float16:
        # torchao's per-channel weight-only path (int8_tensor.py) computes mm(x, int8 weight) in
        # float16 and applies the scale after: the order dequant_matmul avoids, since its product
        # overflows float16 on large activations (and the timed step would hide that)
        problems["torchao"] = message("torchao's weight-only path multiplies by the unscaled int8 weight in "
                                      "float16 before the scale, which overflows float16 (65504) on large "
                                      "activations")
    elif "torchao" in kernels:
        try:
            mods = [(s, _torchao_linear(q, sc, act)) for s, q, _, sc in quantized]
            problems["torchao"] = None
        except VariantUnavailable as exc:
            problems["torchao"] = str(exc)
    steps = {
        "int8pack": lambda: [torch._weight_int8pack_mm(x_act[s], q, sc) for s, q, sc, _ in quantized],
        "dequant": lambda: [dequant_matmul(x_act[s], q, sc) for s, q, sc, _ in quantized],
        "torchao": lambda: [m(x_act[s]) for s, m in mods],
    }
    candidates = [(message("dense {dtype}", dtype=dense_name), lambda: [F.linear(x_model[s], w) for s, w in sampled],
                   torch.tensor([], dtype=model_dtype).element_size(), None, dense_name)]
    candidates += [(k, steps[k], 1, problems[k], label) for k in kernels]
    rows = []
    for name, step, nbytes_per_weight, problem, activations in candidates:
        if problem:
            rows.append({"kernel": name, "problem": problem, "activations": activations})
            continue
        with torch.inference_mode():
            t = bench.measure(step, "cpu", name=name, warmup=2, min_iters=min_iters,
                              min_seconds=min_seconds)
        nbytes, ms = weights * nbytes_per_weight, t.median * 1e3 * stretch
        rows.append({"kernel": name, "decode_ms": ms, "decode_p10_ms": t.p10 * 1e3 * stretch,
                     "decode_p90_ms": t.p90 * 1e3 * stretch, "weight_mb": nbytes / 1e6,
                     "gbps": nbytes / (ms / 1e3) / 1e9, "problem": None, "activations": activations})
    return rows


# --- INT4: which activation dtype the kernel is fastest with (chapter 06's INT4 rung) ---------------

def time_int4_activations(model: nn.Module, skip: Iterable[str] = (), group_size: int = INT4_GROUP, *,
                          min_iters: int = 5, min_seconds: float = 0.1) -> dict:
    """One batch-1 decode step's linears in INT4 (``_weight_int4pack_mm_for_cpu``, groups of
    ``group_size``), once per 16-bit activation dtype the kernel takes (``INT4_ACT_DTYPES``; the
    model's activations cast to it at each linear; float16 only for a float16 model, whose range it
    holds), beside the model's own dense linears.

    Returns ``{"rows", "act_dtype"}``: per candidate the step's ms (median, p10, p90), and the
    activation dtype with the lowest median, the one ``Int4Linear`` then computes in. Linears that
    the packing cannot take (in_features not in whole groups, out_features not a multiple of 16) are
    left out, as ``quantize_model_int4`` leaves them dense. Weights above ``KERNEL_BUDGET_BYTES``
    are timed on their first ones and scaled by the count, as in ``time_w8a16_kernels``.
    """
    groups = {s: ws for s, ws in shape_groups(model, skip).items() if s[1] % group_size == 0 and s[0] % 16 == 0}
    if not groups:
        raise ValueError(f"no linear has in_features divisible by group_size={group_size} and out_features by 16")
    model_dtype, _, sampled, stretch = _sample(groups)
    packed = []
    for shape, w in sampled:
        q, scale, zero = quantize_weight_int4(w, group_size)
        packed.append((shape, w, torch._convert_weight_to_int4pack_for_cpu(q, 8),
                       torch.stack([scale, zero], -1).transpose(0, 1).contiguous()))
    x = {s: torch.full((1, s[1]), 0.5, dtype=model_dtype) for s in groups}

    def int4_step(act):
        scales = [sz.to(act) for _, _, _, sz in packed]
        return lambda: [torch._weight_int4pack_mm_for_cpu(x[s].to(act), q, group_size, sc).to(model_dtype)
                        for (s, _, q, _), sc in zip(packed, scales)]

    candidates = [(message("dense {dtype}", dtype=backend.dtype_name(model_dtype)), lambda: [F.linear(x[s], w) for s, w, _, _ in packed], None)]
    # float16 only for a float16 model: a bfloat16 or float32 activation may exceed float16's 65504
    acts = [a for a in INT4_ACT_DTYPES if a != torch.float16 or model_dtype == torch.float16]
    candidates += [(f"int4 g{group_size}, {backend.dtype_name(act)} activations", int4_step(act), act)
                   for act in acts]
    rows = []
    for name, step, act in candidates:
        with torch.inference_mode():
            try:
                t = bench.measure(step, "cpu", name=name, warmup=2, min_iters=min_iters, min_seconds=min_seconds)
            except RuntimeError as exc:  # a torch without this activation dtype for the kernel
                rows.append({"kernel": name, "problem": str(exc).splitlines()[0][:200], "act_dtype": act})
                continue
        rows.append({"kernel": name, "decode_ms": t.median * 1e3 * stretch, "decode_p10_ms": t.p10 * 1e3 * stretch,
                     "decode_p90_ms": t.p90 * 1e3 * stretch, "problem": None,
                     "activations": backend.dtype_name(act if act is not None else model_dtype),
                     "act_dtype": act})
    usable = [r for r in rows if r["act_dtype"] is not None and not r["problem"]]
    if not usable:
        raise ValueError("the INT4 kernel ran with no 16-bit activation dtype: "
                         + "; ".join(f"{r['kernel']}: {r['problem']}" for r in rows if r["problem"]))
    best = min(usable, key=lambda r: r["decode_ms"])
    return {"rows": [{k: v for k, v in r.items() if k != "act_dtype"} for r in rows], "act_dtype": best["act_dtype"],
            "kernel": best["kernel"]}


def pick_w8a16_kernel(rows: list[dict]) -> dict:
    """The decision from ``time_w8a16_kernels`` rows: the fastest int8 kernel by median, and
    whether it is faster than the dense baseline beyond both spreads.

    Returns ``{"kernel", "beats_dense", "loses_to_dense", "margin"}`` (``margin`` = dense median /
    kernel median; ``loses_to_dense``: the dense step is faster beyond both spreads).
    """
    dense = next((r for r in rows if r["kernel"].startswith("dense") and not r.get("problem")), None)
    usable = [r for r in rows if not r["kernel"].startswith("dense") and not r.get("problem")]
    if not usable:
        raise ValueError("no usable int8 kernel among the rows: " +
                         "; ".join(f"{r['kernel']}: {r.get('problem')}" for r in rows))
    best = min(usable, key=lambda r: r["decode_ms"])
    beats = dense is not None and best["decode_p90_ms"] < dense["decode_p10_ms"]
    loses = dense is not None and dense["decode_p90_ms"] < best["decode_p10_ms"]
    margin = dense["decode_ms"] / best["decode_ms"] if dense else None
    return {"kernel": best["kernel"], "beats_dense": bool(beats), "loses_to_dense": bool(loses), "margin": margin}


def choose_cpu_w8a16_kernel(model: nn.Module, skip: Iterable[str] = ()) -> dict:
    """``time_w8a16_kernels`` + ``pick_w8a16_kernel``, once per process per model shape and dtype.

    Returns ``{"kernel", "rows", "decision"}``.
    """
    groups = shape_groups(model, skip)
    key = (tuple(sorted((s, len(ws)) for s, ws in groups.items())),
           next(iter(groups.values()))[0].dtype, backend.cpu_capability(), torch.get_num_threads())
    if key not in _KERNEL_CHOICES:
        rows = time_w8a16_kernels(model, skip)
        decision = pick_w8a16_kernel(rows)
        _KERNEL_CHOICES[key] = {"kernel": decision["kernel"], "rows": rows, "decision": decision}
    return _KERNEL_CHOICES[key]


@torch.inference_mode()
def calibrate(model: nn.Module, tokenizer, texts: list[str], max_tokens: int = 128, *,
              per_channel: bool = False) -> dict:
    """Max |input| of every ``nn.Linear`` over ``texts``: the static activation range per layer.

    The guide's step 2 (量化参数计算：统计各层激活值分布, collect each layer's activation
    statistics). Scales are per tensor (a float per layer); ``per_channel=True`` keeps the max of
    each input channel instead (a tensor per layer, chapter 05's worked answer). More texts can only
    widen each range.
    """
    if not texts or any(not isinstance(t, str) or not t.strip() for t in texts):
        raise ValueError("texts must be a non-empty list of non-empty calibration strings")
    names = check_model(model)
    amax: dict = {}
    hooks = []
    for name in names:
        def hook(_mod, inputs, _out, name=name):
            x = inputs[0].detach().abs()
            seen = x.reshape(-1, x.shape[-1]).amax(0)
            amax[name] = seen if name not in amax else torch.maximum(amax[name], seen)
        hooks.append(model.get_submodule(name).register_forward_hook(hook))
    device = next(model.parameters()).device
    try:
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :max_tokens].to(device)
            model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return amax if per_channel else {n: float(amax[n].max()) if n in amax else 0.0 for n in names}


# --- library baselines -----------------------------------------------------------------------

@contextmanager
def quiet_imports():
    """torchao and torch.ao warn on import and dynamo logs while torchao quantizes; none of it
    teaches anything (``helpers/__init__`` already keeps the torchao and pytree loggers quiet)."""
    dynamo = logging.getLogger("torch._dynamo")
    level = dynamo.level
    dynamo.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            dynamo.setLevel(level)


def _torchao():
    """torchao's ``(Int8WeightOnlyConfig, quantize_)``; ``VariantUnavailable`` says why not."""
    with quiet_imports():
        try:
            from torchao.quantization import Int8WeightOnlyConfig, quantize_
        except Exception as exc:  # noqa: BLE001  (not installed on the legacy set and older images)
            raise VariantUnavailable(f"torchao is not usable here ({type(exc).__name__}: {exc}); "
                                     "it is installed by make setup on the pinned CPU stack") from exc
    return Int8WeightOnlyConfig, quantize_


def _torchao_linear(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
    """An ``nn.Linear`` holding ``q * scale`` quantized by torchao's ``Int8WeightOnlyConfig``."""
    config, quantize_ = _torchao()
    lin = nn.Linear(q.shape[1], q.shape[0], bias=False, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(dequantize_weight(q, scale, dtype))
    with quiet_imports():
        quantize_(lin, config())
    return lin


def torchao_int8_weight_only(model: nn.Module) -> dict:
    """The library path: torchao ``quantize_(model, Int8WeightOnlyConfig())`` in place.

    Transformers exposes the same thing at load time as ``TorchAoConfig(Int8WeightOnlyConfig())``.
    """
    check_model(model)
    config, quantize_ = _torchao()
    before = weight_bytes(model)
    dtype = next(model.parameters()).dtype
    with quiet_imports():
        quantize_(model, config())
    # torchao computes in the activations' own dtype: W8A16 only when the model is 16-bit
    return {"bytes_before": before, "bytes_after": weight_bytes(model), "layers": None,
            "impl": "torchao Int8WeightOnlyConfig", "scheme": "w8a16" if dtype != torch.float32 else "w8a32",
            "activations": backend.dtype_name(dtype)}


# --- the chapter's variants ----------------------------------------------------------------

VARIANTS = {
    "fp32": "float32, unquantized",
    "dense": "unquantized, in the dtype parameter's dtype (fp16 on NPU/CUDA; on a CPU what auto measured)",
    "w8a16": "hand-written W8A16 Int8Linear, kernel picked per backend",
    "w8a16_dequant": "hand-written W8A16 Int8Linear, dequant-in-forward kernel",
    "torchao": "torchao Int8WeightOnlyConfig on the dense model, in its dtype (library path)",
    "w8a8_dynamic": "W8A8, dynamic per-token activations (npu_dynamic_quant on NPU, emulated elsewhere)",
    "w8a8_static": "W8A8, static per-tensor activation scales from calibration",
    "quantize_dynamic": "torch.ao quantize_dynamic, per-tensor W8 and A8 (float32, CPU only)",
}
# quantize_model_int8's (impl, scheme) for the variants made of Int8Linear
INT8_VARIANTS = {"w8a16": ("auto", "w8a16"), "w8a16_dequant": ("dequant", "w8a16"),
                  "w8a8_dynamic": ("auto", "w8a8"), "w8a8_static": ("auto", "w8a8")}


class VariantUnavailable(RuntimeError):
    """A variant that cannot run on this device or dtype; the message says why."""


# --- INT4 weights, groups of 32 (chapter 06's INT4 rung) ------------------------------------------

def quantize_model_int4(model: nn.Module, group_size: int = INT4_GROUP, skip: Iterable[str] = (),
                        act_dtype: torch.dtype = torch.bfloat16) -> dict:
    """Replace every ``nn.Linear`` (in place) by an ``Int4Linear`` computing in ``act_dtype``;
    returns what ``quantize_model_int8`` does."""
    names = check_model(model, skip)
    if problem := int4_problem(model.get_submodule(names[0]).weight.device):
        raise ValueError(problem)
    # The packing needs in_features in whole groups and out_features in multiples of 16; a linear
    # that is not stays as it is (named in the result).
    kept = [n for n in names if model.get_submodule(n).in_features % group_size
            or model.get_submodule(n).out_features % 16]
    if len(kept) == len(names):
        raise ValueError(f"no linear has in_features divisible by group_size={group_size} and "
                         "out_features divisible by 16")
    before = weight_bytes(model)
    dtype = model.get_submodule(names[0]).weight.dtype
    replace_linears(model, [n for n in names if n not in kept],
                     lambda _, lin: Int4Linear(lin, group_size, act_dtype))
    return {"bytes_before": before, "bytes_after": weight_bytes(model), "layers": len(names) - len(kept),
            "kept_unquantized": kept,
            "impl": f"_weight_int4pack_mm_for_cpu, groups of {group_size}", "scheme": "w4a16",
            "activations": activations_label(act_dtype, dtype)}
