"""Strict stand-ins for ``torch_npu``, one per supported torch_npu line, with reference math.

``build(line)`` returns a module that has **exactly** the ops of that line (``line_*.py`` in this
folder, loaded with ``npu_line.load``), with the parameters of that line's op-plugin yaml, and that
rejects what the real op rejects: a helper that calls an op the line lacks, passes a keyword the line
does not know, feeds a dtype or shape the op refuses, or forgets that ``npu_rms_norm`` returns a
tuple, fails here as it would on that image. Where the real error text is in the sources it is
used verbatim (the C++ ``TORCH_CHECK`` messages of op-plugin); where the rejection happens inside
aclnn, whose messages are not in the sources, the text says so.

Each op is marked with ``torch._dynamo.allow_in_graph`` so that a compiled graph holds it as one
node, as the real ``torch.ops.npu.*`` ops are; the fake torchair (``fake_torchair.py``) then checks
those nodes against the line's GE converters. Every call is logged in ``CALLS``; ``LAST`` keeps the
tensors of each op's latest call, so tests can check layouts and that a scale is not re-cast per call.

The rules below hold on every line unless a line file says otherwise; the source of each is beside it
(``26.0.0 docs`` = Ascend/op-plugin@6ffd6e22:docs/zh/custom_APIs/torch_npu/, ``7.2.0 docs`` =
Ascend/op-plugin@30d42570:docs/context/).
"""
from __future__ import annotations

import math
import types

import torch
import torch.nn.functional as F

_UNSET = object()  # a parameter the caller did not pass (so a line without it can reject it)
FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_TYPES = (torch.float16, torch.bfloat16)
ACLNN = " (the real rejection comes from aclnn; its message is not in the sources)"


def _shape(t):
    return tuple(t.shape)


class _Config:
    """``torch.npu.config``: set-only; every name but allow_internal_format is silently ignored.

    Ascend/pytorch@v2.1.0-6.0.rc2:torch_npu/npu/npu_config.py:136-141 (``_npuConfig.__setattr__`` is a
    classmethod that maps only allow_internal_format to an option, and there is no getter); the same
    at v2.1.0-5.0.0 (``npuConfig``, :124-129), v2.7.1-7.2.0 (:140-145) and v2.9.0-26.0.0 (:152-157).
    """

    def __init__(self):
        object.__setattr__(self, "_options", {})

    def __setattr__(self, name, value):
        if name == "allow_internal_format":
            self._options["ALLOW_INTERNAL_FORMAT"] = value

    def __getattr__(self, name):
        raise AttributeError(name)


def build(line) -> types.ModuleType:
    """A ``torch_npu`` module for ``line`` (a module from ``npu_line.load``)."""
    fake = types.ModuleType("torch_npu")
    fake.__file__ = __file__
    fake.__version__ = line.TORCH_NPU_VERSION
    fake.LINE = line
    fake.CALLS = []
    fake.LAST = {}
    calls, last = fake.CALLS, fake.LAST

    def log(name, **tensors):
        calls.append(name)
        last[name] = tensors

    def check_params(op, **given):
        allowed = line.OPS[op]
        for key, value in given.items():
            if value is not _UNSET and key not in allowed:
                # torch's PythonArgParser wording for a keyword the binding does not have
                raise TypeError(f"{op}() got an unexpected keyword argument '{key}'")

    # --- RMSNorm ----------------------------------------------------------------------------------
    def npu_rms_norm(self, gamma, epsilon=1e-06):
        """-> (y, rstd); y in self's dtype, rstd float32 with the normalised dims kept as 1."""
        log("npu_rms_norm", x=self, gamma=gamma)
        # 26.0.0 docs (beta)torch_npu-npu_rms_norm.md: gamma_shape = self_shape[n:], n < self.dims()
        if gamma.dim() == 0 or gamma.dim() > self.dim() or _shape(gamma) != _shape(self)[self.dim() - gamma.dim():]:
            raise RuntimeError(f"npu_rms_norm: gamma shape {_shape(gamma)} must equal the trailing dims of self "
                               f"{_shape(self)}" + ACLNN)
        # same page, 约束说明: the (self, gamma) dtype pairs of A2/A3
        if (self.dtype, gamma.dtype) not in line.RMS_NORM_DTYPES:
            raise RuntimeError(f"npu_rms_norm: self {self.dtype} with gamma {gamma.dtype} is not a supported "
                               "dtype pair (fp16/fp32, bf16/fp32, fp16/fp16, bf16/bf16, fp32/fp32)" + ACLNN)
        dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
        x32 = self.float()
        rstd = torch.rsqrt(x32.pow(2).mean(dims, keepdim=True) + epsilon)
        y = (x32 * rstd * gamma.float()).to(self.dtype)
        return y, rstd

    def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-06):
        """-> (y, rstd, x1 + x2)."""
        log("npu_add_rms_norm", x1=x1, x2=x2, gamma=gamma)
        # 26.0.0 docs torch_npu-npu_add_rms_norm.md: x1, x2 fp32/fp16/bf16; gamma in x1's dtype
        for name, t in (("x1", x1), ("x2", x2)):
            if t.dtype not in FLOAT_TYPES:
                raise RuntimeError(f"npu_add_rms_norm: {name} must be float32, float16 or bfloat16, got {t.dtype}"
                                   + ACLNN)
        if gamma.dtype != x1.dtype or x2.dtype != x1.dtype:
            raise RuntimeError(f"npu_add_rms_norm: gamma and x2 must have x1's dtype {x1.dtype}, got gamma "
                               f"{gamma.dtype}, x2 {x2.dtype}" + ACLNN)
        # the docs do not describe broadcasting x2; the fake requires x1's shape
        if x1.shape != x2.shape:
            raise RuntimeError("npu_add_rms_norm: x1 and x2 must have the same shape" + ACLNN)
        x_sum = (x1.float() + x2.float()).to(x1.dtype)
        x32 = x_sum.float()
        dims = tuple(range(x1.dim() - gamma.dim(), x1.dim()))
        rstd = torch.rsqrt(x32.pow(2).mean(dims, keepdim=True) + epsilon)
        y = (x32 * rstd * gamma.float()).to(x1.dtype)
        return y, rstd, x_sum

    def npu_swiglu(input, dim=-1):
        """silu(a) * b, a and b the two halves of ``input`` along ``dim``."""
        log("npu_swiglu", x=input)
        # 26.0.0 docs (beta)torch_npu-npu_swiglu.md: fp32/fp16/bf16, 1-8 dims, even along dim,
        # "不支持非连续的Tensor" (no non-contiguous input)
        if input.dtype not in FLOAT_TYPES:
            raise RuntimeError(f"npu_swiglu: input must be float32, float16 or bfloat16, got {input.dtype}" + ACLNN)
        if not 1 <= input.dim() <= 8:
            raise RuntimeError(f"npu_swiglu: input must have 1-8 dims, got {input.dim()}" + ACLNN)
        if not -input.dim() <= dim < input.dim():
            # op-plugin@b761d582:op_plugin/ops/base_ops/opapi/SwiGluKernelNpuOpApi.cpp:27
            raise RuntimeError(f"dim out of range{dim}")
        if not input.is_contiguous():
            raise RuntimeError("npu_swiglu: input must be contiguous" + ACLNN)
        if input.shape[dim] % 2:
            raise RuntimeError(f"npu_swiglu: input size {input.shape[dim]} along dim {dim} must be even" + ACLNN)
        a, b = input.float().chunk(2, dim=dim)
        return (F.silu(a) * b).to(input.dtype)

    # --- W8A16 ------------------------------------------------------------------------------------
    def npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None, quant_scale=None,
                                     quant_offset=None, bias=None, antiquant_group_size=0,
                                     inner_precise=_UNSET, weight_dtype=_UNSET):
        """y = x @ ((weight + offset) * scale) (+ bias); weight int8 (K, N), per-channel scale (N,) or (1, N)."""
        check_params("npu_weight_quant_batchmatmul", inner_precise=inner_precise, weight_dtype=weight_dtype)
        log("npu_weight_quant_batchmatmul", x=x, weight=weight, antiquant_scale=antiquant_scale)
        # op-plugin@30d42570:op_plugin/ops/opapi/WeightQuantBatchMatmulV2KernelNpuOpApi.cpp:35-46 (same
        # texts at b761d582:.../base_ops/opapi/WeightQuantBatchMatmulV2KernelNpuOpApi.cpp)
        if x.dim() < 2:
            raise RuntimeError(f"x shape do not support dim num less than 2, but it is {x.dim()}")
        if weight.dim() < 2:
            raise RuntimeError(f"weight shape do not support dim num less than 2, but it is {weight.dim()}")
        # 7.2.0 docs torch_npu-npu_weight_quant_batchmatmul.md (and 6.0.RC1 docs, hiascend
        # Pytorch/60RC1 ptaoplist_000747): A2 takes x as float16 / bfloat16, 2-D (M, K)
        if x.dtype not in HALF_TYPES:
            raise RuntimeError(f"npu_weight_quant_batchmatmul: x must be float16 or bfloat16, got {x.dtype}" + ACLNN)
        if x.dim() != 2 or weight.dim() != 2:
            raise RuntimeError(f"npu_weight_quant_batchmatmul: x and weight must be 2-D (M, K) and (K, N) on A2, "
                               f"got {_shape(x)} and {_shape(weight)}" + ACLNN)
        if weight.dtype != torch.int8:  # int32-packed int4 is not modelled
            raise RuntimeError(f"npu_weight_quant_batchmatmul: weight must be int8, got {weight.dtype}" + ACLNN)
        k, n = weight.shape
        if x.shape[1] != k:
            raise RuntimeError(f"The k of x and weight should be equal. but x_k_dim is {x.shape[1]}, "
                               f"weight_k_dim is {k}")
        # 7.2.0 docs, 约束说明: K and N in [1, 65535]
        if not (1 <= k <= 65535 and 1 <= n <= 65535):
            raise RuntimeError(f"npu_weight_quant_batchmatmul: K={k} and N={n} must be in [1, 65535]" + ACLNN)
        # 7.2.0 docs, antiquant_scale: fp16/bf16 in x's dtype (int64 needs a special layout, not modelled);
        # single-op mode requires x and antiquant_scale to have the same dtype
        if antiquant_scale.dtype != x.dtype:
            raise RuntimeError(f"npu_weight_quant_batchmatmul: antiquant_scale must have x's dtype {x.dtype} "
                               f"(single-op mode), got {antiquant_scale.dtype}" + ACLNN)
        per_channel = _shape(antiquant_scale) in ((n,), (1, n))
        per_tensor = _shape(antiquant_scale) in ((1,), (1, 1))
        group_ok = antiquant_group_size and _shape(antiquant_scale) == (math.ceil(k / antiquant_group_size), n)
        if not (per_channel or per_tensor or group_ok):
            raise RuntimeError(f"npu_weight_quant_batchmatmul: antiquant_scale shape {_shape(antiquant_scale)} is not "
                               f"per-tensor (1,), per-channel ({n},)/(1, {n}) or per-group" + ACLNN)
        if antiquant_offset is not None and (antiquant_offset.shape != antiquant_scale.shape
                                             or antiquant_offset.dtype != antiquant_scale.dtype):
            raise RuntimeError("npu_weight_quant_batchmatmul: antiquant_offset must match antiquant_scale's "
                               "shape and dtype" + ACLNN)
        # WeightQuantBatchMatmulV2KernelNpuOpApi.cpp:73-78 (30d42570)
        valid_group = antiquant_group_size == 0 or (32 <= antiquant_group_size <= k - 1 and antiquant_group_size % 32 == 0)
        if not valid_group:
            raise RuntimeError("antiquant_group_size can be either 0 or a multiple of 32 within the range 32 to "
                               "weight_k_dim - 1.")
        if quant_offset is not None and quant_scale is None:
            raise RuntimeError("Quantization parameters are incorrectly set, quant_offset cannot exist in isolation "
                               "from quant_scale")
        if quant_scale is not None:
            raise NotImplementedError("the fake does not model quant_scale (int8 output)")
        # 7.2.0 docs, bias: bf16 x -> float32 bias, fp16 x -> float16 bias
        if bias is not None and bias.dtype != (torch.float32 if x.dtype == torch.bfloat16 else torch.float16):
            raise RuntimeError(f"npu_weight_quant_batchmatmul: bias must be float32 for bf16 x and float16 for "
                               f"fp16 x, got {bias.dtype} for {x.dtype}" + ACLNN)
        # op-plugin's is_transpose_last_two_dims: a (K, N) view of a contiguous (N, K) tensor; the
        # docs recommend it for per-channel weights (7.2.0 docs, weight: "perchannel场景下为提高性能推荐使用
        # transpose后的weight输入")
        last["npu_weight_quant_batchmatmul"]["weight_layout"] = (
            "transposed" if weight.stride() == (1, k) else "contiguous" if weight.is_contiguous() else "other")
        w = weight.float()
        if antiquant_group_size and group_ok:
            rows = torch.arange(k) // antiquant_group_size
            scale = antiquant_scale.float()[rows]
            offset = 0 if antiquant_offset is None else antiquant_offset.float()[rows]
        else:
            scale = antiquant_scale.float().reshape(1, -1)
            offset = 0 if antiquant_offset is None else antiquant_offset.float().reshape(1, -1)
        y = x.float() @ ((w + offset) * scale)
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype)

    # --- W8A8 -------------------------------------------------------------------------------------
    def npu_dynamic_quant(input, *, smooth_scales=None, group_index=_UNSET, dst_type=_UNSET,
                          quant_mode=_UNSET, dst_type_max=_UNSET):
        """Per-token symmetric int8 -> (int8 like input, float32 scale of shape input.shape[:-1])."""
        check_params("npu_dynamic_quant", group_index=group_index, dst_type=dst_type, quant_mode=quant_mode,
                     dst_type_max=dst_type_max)
        log("npu_dynamic_quant", x=input)
        # 7.2.0 docs torch_npu-npu_dynamic_quant.md: x float16 / bfloat16, dim > 1
        if input.dtype not in HALF_TYPES:
            raise RuntimeError(f"npu_dynamic_quant: x must be float16 or bfloat16, got {input.dtype}" + ACLNN)
        if input.dim() <= 1:
            raise RuntimeError(f"npu_dynamic_quant: x must have more than 1 dim, got {input.dim()}" + ACLNN)
        if dst_type not in (_UNSET, None, torch.int8):
            # op-plugin@30d42570:op_plugin/ops/opapi/DynamicQuantKernelNpuOpApi.cpp:57-58 (int4 not modelled)
            raise RuntimeError("dtype must be torch.int8 for int8 or torch.quint4x2 for int4")
        x = input.float()
        if smooth_scales is not None:
            x = x * smooth_scales.float()
        scale = x.abs().amax(dim=-1).clamp(min=1e-8) / 127.0
        q = torch.round(x / scale.unsqueeze(-1)).clamp(-128, 127).to(torch.int8)
        return q, scale

    def npu_trans_quant_param(scale, offset=None, round_mode=_UNSET):
        """float32 scale -> int64 holding its bits: (bits & 0xFFFFE000) | (1 << 46) (7.2.0 docs
        torch_npu-npu_trans_quant_param.md, 计算公式; offset and round_mode are not modelled)."""
        check_params("npu_trans_quant_param", round_mode=round_mode)
        log("npu_trans_quant_param", scale=scale)
        if scale.dtype != torch.float32 or scale.dim() not in (1, 2) or not scale.is_contiguous():
            raise RuntimeError("npu_trans_quant_param: scale must be a contiguous 1-D or 2-D float32 tensor" + ACLNN)
        if offset is not None:
            raise NotImplementedError("the fake does not model npu_trans_quant_param's offset")
        bits = scale.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        return (bits & 0xFFFFE000) | (1 << 46)

    def _decode_scale(scale):
        if scale.dtype == torch.int64:  # the bits npu_trans_quant_param stored, 19 high bits of the float
            return (scale & 0xFFFFE000).to(torch.int32).view(torch.float32)
        return scale.float()

    def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
                         x1_dtype=_UNSET, x2_dtype=_UNSET, pertoken_scale_dtype=_UNSET, scale_dtype=_UNSET,
                         group_sizes=_UNSET, y_scale=_UNSET):
        """int8 x1 (M, K) @ int8 x2 (K, N), dequantised by scale (N) and pertoken_scale (M)."""
        check_params("npu_quant_matmul", x1_dtype=x1_dtype, x2_dtype=x2_dtype,
                     pertoken_scale_dtype=pertoken_scale_dtype, scale_dtype=scale_dtype, group_sizes=group_sizes,
                     y_scale=y_scale)
        log("npu_quant_matmul", x1=x1, x2=x2, scale=scale, pertoken_scale=pertoken_scale)
        last["npu_quant_matmul"]["output_dtype"] = output_dtype
        # op-plugin@b761d582:op_plugin/ops/base_ops/opapi/QuantMatmulKernelNpuOpApi.cpp:81-90, 118-122
        if not 2 <= x1.dim() <= 6:
            raise RuntimeError(f"x1 shape dim num should be within 2~6, but it is {x1.dim()}")
        if not 2 <= x2.dim() <= 6:
            raise RuntimeError(f"x2 shape dim num should be within 2~6, but it is {x2.dim()}")
        if x1.shape[-1] != x2.shape[-2]:
            raise RuntimeError(f"The k of x1 and x2 should be equal. but x1_k_dim is {x1.shape[-1]}, "
                               f"x2_k_dim is {x2.shape[-2]}")
        if scale.dim() != 1:
            raise RuntimeError(f"The scale dim num should be 1. but scale_dim_num is {scale.dim()}")
        n = x2.shape[-1]
        if scale.shape[0] not in (1, n):
            raise RuntimeError(f"The scale 1st dim should be 1 or n, but scale_first_dim is {scale.shape[0]}")
        # docs: x1 and x2 int8 (int32-packed int4 not modelled); last dims <= 65535 (7.2.0 docs 约束说明)
        if x1.dtype != torch.int8 or x2.dtype != torch.int8:
            raise RuntimeError(f"npu_quant_matmul: x1 and x2 must be int8, got {x1.dtype} and {x2.dtype}" + ACLNN)
        if x1.shape[-1] > 65535 or x2.shape[-1] > 65535:
            raise RuntimeError("npu_quant_matmul: the last dims of x1 and x2 must not exceed 65535" + ACLNN)
        # output_dtype None means int8 (b761d582 QuantMatmulKernelNpuOpApi.cpp:102-103; 7.2.0 docs)
        out_dtype = torch.int8 if output_dtype is None else output_dtype
        if out_dtype not in line.QUANT_MATMUL_OUTPUT_DTYPES:
            raise RuntimeError(f"npu_quant_matmul: output_dtype {out_dtype} is not supported; this line takes "
                               f"{', '.join(map(str, line.QUANT_MATMUL_OUTPUT_DTYPES))}" + ACLNN)
        # the docs' table of dtype combinations on A2 (7.2.0 docs 表2; 6.0.0 docs, hiascend Pytorch/600
        # ptaoplist_000858, the same rows without int32 output)
        if pertoken_scale is not None:
            if pertoken_scale.dtype != torch.float32 or _shape(pertoken_scale) != (x1.shape[-2],):
                raise RuntimeError(f"npu_quant_matmul: pertoken_scale must be float32 of shape ({x1.shape[-2]},), got "
                                   f"{pertoken_scale.dtype} {_shape(pertoken_scale)}" + ACLNN)
        allowed = {
            torch.int8: (torch.int64, torch.float32) if pertoken_scale is None else (),
            torch.float16: (torch.int64, torch.float32) if pertoken_scale is None else (torch.float32,),
            torch.bfloat16: (torch.float32, torch.bfloat16),
            torch.int32: (torch.float32, torch.bfloat16) if pertoken_scale is None else (),
        }[out_dtype]
        if scale.dtype not in allowed:
            raise RuntimeError(f"npu_quant_matmul: scale {scale.dtype} with output {out_dtype} and "
                               f"{'a' if pertoken_scale is not None else 'no'} pertoken_scale is not a supported "
                               "combination" + ACLNN)
        acc = x1.to(torch.float64) @ x2.to(torch.float64)  # exact for int8 products summed over K <= 65535
        y = acc * _decode_scale(scale).double().reshape(-1)
        if pertoken_scale is not None:
            y = y * pertoken_scale.double().unsqueeze(-1)
        if bias is not None:
            y = y + bias.double()
        if out_dtype == torch.int8:
            return torch.round(y).clamp(-128, 127).to(torch.int8)
        return y.to(out_dtype)

    available = {
        "npu_rms_norm": npu_rms_norm, "npu_add_rms_norm": npu_add_rms_norm, "npu_swiglu": npu_swiglu,
        "npu_weight_quant_batchmatmul": npu_weight_quant_batchmatmul, "npu_dynamic_quant": npu_dynamic_quant,
        "npu_trans_quant_param": npu_trans_quant_param, "npu_quant_matmul": npu_quant_matmul,
    }
    for name in line.OPS:
        fn = available[name]
        fn._npu_op = name  # what the fake GE backend reads from a graph node's target
        setattr(fake, name, torch._dynamo.allow_in_graph(fn))

    def make_npu_namespace(available: bool = False):
        """A ``torch.npu`` namespace of this line; ``available=False`` mimics a machine without an NPU."""
        ns = types.SimpleNamespace()
        ns.is_available = lambda: available
        ns.device_count = lambda: 1 if available else 0
        ns.synchronize = lambda *a, **k: calls.append("synchronize")
        ns.get_device_name = lambda i=0: "Ascend910B4"
        if line.HAS_MEM_GET_INFO:
            ns.mem_get_info = lambda i=0: (30 * 2**30, 32 * 2**30)
        ns.max_memory_allocated = lambda *a: 0
        ns.memory_allocated = lambda *a: 0
        ns.reset_peak_memory_stats = lambda *a: None
        ns.empty_cache = lambda: None
        ns.is_bf16_supported = lambda: True

        # torch_npu/npu/npu_config.py: def set_compile_mode(jit_compile=False) on every line
        # (v2.1.0-5.0.0:74, v2.1.0-6.0.rc2:84, v2.7.1-7.2.0:88, v2.9.0-26.0.0:100)
        def set_compile_mode(jit_compile=False):
            calls.append(f"set_compile_mode({jit_compile})")
        ns.set_compile_mode = set_compile_mode
        ns.config = _Config()
        return ns

    fake.make_npu_namespace = make_npu_namespace
    fake.npu = None  # set by the fixture to the same namespace as torch.npu
    return fake
