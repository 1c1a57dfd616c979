"""torch_npu 2.5.1 + CANN 8.1.RC1 + torchair 7.0.0: the first torchair with ``CompilerConfig.mode``
(``max-autotune`` and ``reduce-overhead``), whose backend still takes no ``**kwargs``.

Built from Ascend/pytorch tag v7.0.0-pytorch2.5.1 (branch v2.5.1-7.0.0; version.txt says 2.5.1), whose
submodules pin Ascend/op-plugin 8abaa31255ba7feea4aee926309e5951f12034a1 (branch 7.0.0) and
Ascend/torchair 89ff4af2522680e8b2e7c8813537be9b918e64b6 (branch 7.0.0). No ModelArts image name with
this torch_npu was found; it stands for any image built on it.
"""
import torch

NAME = "2.5.1"
# Ascend/pytorch@master:COMPATIBILITY.en.md: "2.5.1 | v2.5.1-7.0.0 | 2.5.1 | CANN 8.1.RC1"
TORCH_NPU_VERSION = "2.5.1"
TORCH = "2.5.1"
CANN = "8.1.RC1"
PYTORCH_BRANCH = "v2.5.1-7.0.0"
OP_PLUGIN = "Ascend/op-plugin@8abaa312 (branch 7.0.0)"
TORCHAIR = "Ascend/torchair@89ff4af2 (branch 7.0.0)"

# --- torch_npu ops and their parameters (8abaa312:op_plugin/config/op_plugin_functions.yaml) --------
OPS = {
    "npu_rms_norm": ("self", "gamma", "epsilon"),                                  # :7122
    "npu_add_rms_norm": ("x1", "x2", "gamma", "epsilon"),                          # :6458
    "npu_swiglu": ("input", "dim"),                                                # :7259
    "npu_weight_quant_batchmatmul": ("x", "weight", "antiquant_scale", "antiquant_offset", "quant_scale",
                                     "quant_offset", "bias", "antiquant_group_size", "inner_precise"),  # :7306
    "npu_dynamic_quant": ("input", "smooth_scales", "group_index", "dst_type"),    # :6705
    "npu_trans_quant_param": ("scale", "offset"),                                  # :7288, no round_mode
    "npu_quant_matmul": ("x1", "x2", "scale", "offset", "pertoken_scale", "bias", "output_dtype"),  # :7048
}
# 8abaa312:op_plugin/ops/opapi/QuantMatmulKernelNpuOpApi.cpp:113-117 (None -> int8) and :126-127, which
# route an int32 output (at::kInt) with a float32 scale past npu_trans_quant_param.
QUANT_MATMUL_OUTPUT_DTYPES = (torch.int8, torch.float16, torch.bfloat16, torch.int32)

# --- torchair ----------------------------------------------------------------------------------
# 89ff4af2:python/torchair/configs/compiler_config.py:21-33
COMPILER_CONFIG_OPTIONS = ("debug", "aoe_config", "export", "dump_config", "fusion_config",
                           "experimental_config", "inference_config", "ge_config")
MODES = ("max-autotune", "reduce-overhead")                                        # :31
# 89ff4af2:python/torchair/configs/_option_base.py:42-45 and :129-130 (@pretty_error_msg)
OPTION_ERROR_STYLE = "verbose"
WRAPS_CONFIG_ERRORS = True
# 89ff4af2:python/torchair/npu_fx_compiler.py:417 _npu_backend(gm, example_inputs, compiler_config=None,
# decompositions={}): no **kwargs. :453 get_npu_backend(*, compiler_config=None, custom_decompositions={}),
# with no deprecation check of reduce-overhead (that arrives with 7.3.0).
BACKEND_OPTIONS = None
# 89ff4af2:python/torchair/_ge_concrete_graph/ge_converter/custom/: npu_rms_norm.py:34,
# npu_add_rms_norm.py:34, npu_swiglu.py:32, npu_weight_quant_batchmatmul.py:37, quantmatmul.py:38,
# npu_dynamic_quant.py:14, transquantparam.py:31.
GE_CONVERTERS = frozenset({"npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_weight_quant_batchmatmul",
                           "npu_quant_matmul", "npu_dynamic_quant", "npu_trans_quant_param"})
# 89ff4af2:python/torchair/_ge_concrete_graph/fx2ge_converter.py:853
GE_ERROR = "Unsupported torch op {target} by ge"

RMS_NORM_DTYPES = {
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)}
UNVERIFIED = (
    "npu_rms_norm gamma dtype pairs and npu_swiglu's contiguity rule: the tables of op-plugin 26.0.0 "
    "docs/zh/custom_APIs/torch_npu/ are applied",
    "npu_weight_quant_batchmatmul's K, N <= 65535 and the other INT8 dtype rules come from the 7.2.0 docs; "
    "their aclnn error texts are not in these sources",
    "aten ops are assumed to have GE converters; only the npu ops are checked",
)
