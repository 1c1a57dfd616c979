"""A stand-in for ``torch_npu`` with the documented signatures and reference math.

It lets CPU tests exercise the NPU code paths: a helper that calls an op with the wrong
arguments, or forgets that ``npu_rms_norm`` returns a tuple, fails here as it would on an NPU.
Signatures follow the op-plugin definitions quoted in the project's NPU API reference. Every call
is logged in ``CALLS`` so tests can assert that the NPU path really ran.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

__version__ = "2.13.0"  # pairs with the pinned torch
CALLS: list[str] = []


def _log(name):
    CALLS.append(name)


def npu_rms_norm(self, gamma, epsilon=1e-06):
    """-> (y, rstd); rstd is float32 with the reduced dim kept."""
    _log("npu_rms_norm")
    if gamma.shape != self.shape[-gamma.dim():]:
        raise RuntimeError(f"npu_rms_norm: gamma shape {tuple(gamma.shape)} does not match the "
                           f"trailing dims of x {tuple(self.shape)}")
    x32 = self.float()
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + epsilon)
    y = (x32 * rstd * gamma.float()).to(self.dtype)
    return y, rstd


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-06):
    """-> (y, rstd, x1 + x2)."""
    _log("npu_add_rms_norm")
    if x1.shape != x2.shape:
        raise RuntimeError("npu_add_rms_norm: x1 and x2 must have the same shape")
    x_sum = x1 + x2
    y, rstd = npu_rms_norm(x_sum, gamma, epsilon)
    CALLS.pop()  # count the fused op once
    return y, rstd, x_sum


def npu_swiglu(input, dim=-1):
    """silu(a) * b where a, b are the two halves of ``input`` along ``dim``."""
    _log("npu_swiglu")
    if input.shape[dim] % 2:
        raise RuntimeError("npu_swiglu: the split dim must be even")
    a, b = input.chunk(2, dim=dim)
    return F.silu(a) * b


def npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                 quant_offset=None, bias=None, antiquant_group_size=0, inner_precise=0):
    """W8A16: y = x @ ((weight + offset) * scale); weight int8 laid out (K, N), scale per N."""
    _log("npu_weight_quant_batchmatmul")
    if weight.dtype != torch.int8:
        raise RuntimeError(f"npu_weight_quant_batchmatmul: weight must be int8, got {weight.dtype}")
    if weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise RuntimeError(f"npu_weight_quant_batchmatmul: weight must be (K, N) with K = x.shape[-1]; "
                           f"got weight {tuple(weight.shape)} for x {tuple(x.shape)}")
    n = weight.shape[1]
    if antiquant_scale.numel() != n:
        raise RuntimeError(f"npu_weight_quant_batchmatmul: antiquant_scale must have N={n} elements")
    w = weight.to(x.dtype)
    if antiquant_offset is not None:
        w = w + antiquant_offset.reshape(1, n).to(x.dtype)
    w = w * antiquant_scale.reshape(1, n).to(x.dtype)
    y = x @ w
    if bias is not None:
        y = y + bias
    return y


def npu_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None):
    """Per-token symmetric int8 quantization -> (int8 tensor, float32 scale per token)."""
    _log("npu_dynamic_quant")
    x = input.float()
    if smooth_scales is not None:
        x = x * smooth_scales.float()
    scale = x.abs().amax(dim=-1).clamp(min=1e-8) / 127.0
    q = torch.round(x / scale.unsqueeze(-1)).clamp(-128, 127).to(torch.int8)
    return q, scale


def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
                     x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None,
                     group_sizes=None):
    """W8A8: int8 x1 (M, K) @ int8 x2 (K, N), dequantised by ``scale`` (N) and ``pertoken_scale`` (M)."""
    _log("npu_quant_matmul")
    if x1.dtype != torch.int8 or x2.dtype != torch.int8:
        raise RuntimeError("npu_quant_matmul: x1 and x2 must be int8")
    if x2.shape[0] != x1.shape[-1]:
        raise RuntimeError(f"npu_quant_matmul: x2 must be (K, N); got {tuple(x2.shape)} for x1 {tuple(x1.shape)}")
    acc = x1.to(torch.int32).float() @ x2.to(torch.int32).float()
    y = acc * scale.float().reshape(-1)
    if pertoken_scale is not None:
        y = y * pertoken_scale.float().unsqueeze(-1)
    if bias is not None:
        y = y + bias.float()
    return y.to(output_dtype or torch.float16)


class _Config:
    """``torch.npu.config``: set-only, like the real one; unknown names are silently ignored."""

    def __init__(self):
        object.__setattr__(self, "_options", {})

    def __setattr__(self, name, value):
        if name == "allow_internal_format":
            self._options["ALLOW_INTERNAL_FORMAT"] = value
        # every other name is ignored, as in torch_npu/npu/npu_config.py

    def __getattr__(self, name):
        raise AttributeError(name)


def make_npu_namespace(available: bool = False):
    """A minimal ``torch.npu`` namespace; ``available=False`` mimics a machine without an NPU."""
    ns = types.SimpleNamespace()
    ns.is_available = lambda: available
    ns.device_count = lambda: 1 if available else 0
    ns.synchronize = lambda *a, **k: CALLS.append("synchronize")
    ns.get_device_name = lambda i=0: "Ascend910B4"
    ns.mem_get_info = lambda i=0: (30 * 2**30, 32 * 2**30)
    ns.max_memory_allocated = lambda *a: 0
    ns.memory_allocated = lambda *a: 0
    ns.reset_peak_memory_stats = lambda *a: None
    ns.empty_cache = lambda: None
    ns.is_bf16_supported = lambda: True
    ns.set_compile_mode = lambda jit_compile=True: CALLS.append(f"set_compile_mode({jit_compile})")
    ns.config = _Config()
    return ns


npu = None  # set by the fixture to the same namespace as torch.npu
