"""torch_npu 2.1.0.post10 + CANN 8.0.0: the torch 2.1 line ``versions.check_support_floor`` recommends,
with a torchair that has no ``CompilerConfig.mode`` but a GE converter for every fused and INT8 op.

Built from Ascend/pytorch tag v6.0.0-pytorch2.1.0 (branch v2.1.0-6.0.0; its setup.py:30 says
VERSION = '2.1.0.post10'), whose submodules pin Ascend/op-plugin
65b69b64d8314db12e1a5a5e19bcc7b2b567cbca (branch 6.0.0) and Ascend/torchair
9593780beb451f565072374f572c452cf36d9e61 (branch 6.0.0). From 6.0.0 op-plugin has one
op_plugin/config/op_plugin_functions.yaml for every torch line, each entry marked with the versions
that get it. No ModelArts image name with this torch_npu was found; it stands for any image built on it.
"""
import torch

NAME = "2.1.0.post10"
# Ascend/pytorch@master:COMPATIBILITY.en.md: "2.1.0.post10 | v2.1.0-6.0.0 | 2.1.0 | CANN 8.0.0"
TORCH_NPU_VERSION = "2.1.0.post10"
TORCH = "2.1.0"
CANN = "8.0.0"
PYTORCH_BRANCH = "v2.1.0-6.0.0"
OP_PLUGIN = "Ascend/op-plugin@65b69b64 (branch 6.0.0)"
TORCHAIR = "Ascend/torchair@9593780b (branch 6.0.0)"

# --- torch_npu ops and their parameters (65b69b64:op_plugin/config/op_plugin_functions.yaml) --------
# npu_trans_quant_param's "exposed:" list leaves out v2.1, which only keeps it off torch_npu's list of
# public names (codegen/utils.py filt_exposed_api); the binding is there (op_api: all_version) and
# torch_npu's own torch_npu/contrib/module/linear_quant.py:106 calls torch_npu.npu_trans_quant_param.
OPS = {
    "npu_rms_norm": ("self", "gamma", "epsilon"),                                  # :7045
    "npu_add_rms_norm": ("x1", "x2", "gamma", "epsilon"),                          # :6479
    "npu_swiglu": ("input", "dim"),                                                # :7163 (Tensor self, int dim=-1)
    "npu_weight_quant_batchmatmul": ("x", "weight", "antiquant_scale", "antiquant_offset", "quant_scale",
                                     "quant_offset", "bias", "antiquant_group_size", "inner_precise"),  # :7198
    "npu_dynamic_quant": ("input", "smooth_scales", "group_index", "dst_type"),    # :6715 [v2.1, newest]
    "npu_trans_quant_param": ("scale", "offset"),                                  # :7180, no round_mode
    "npu_quant_matmul": ("x1", "x2", "scale", "offset", "pertoken_scale", "bias", "output_dtype"),  # :7011
}
# 65b69b64:op_plugin/ops/opapi/QuantMatmulKernelNpuOpApi.cpp:113-117 passes output_dtype through
# (None -> int8) and :126 knows no int32 output (7.0.0's :126-127 adds at::kInt); the 6.0.0 docs table
# (hiascend Pytorch/600 ptaoplist_000858) lists int8, float16 and bfloat16.
QUANT_MATMUL_OUTPUT_DTYPES = (torch.int8, torch.float16, torch.bfloat16)

# --- torchair ----------------------------------------------------------------------------------
# 9593780b:python/torchair/configs/compiler_config.py:22-33: no self.mode.
COMPILER_CONFIG_OPTIONS = ("debug", "aoe_config", "export", "dump_config", "fusion_config",
                           "experimental_config", "inference_config", "ge_config")
MODES = None
# 9593780b:python/torchair/configs/_option_base.py:42-45 ("Value ... not in optional list ... (type: ...)")
# and :129-130 (@pretty_error_msg around NpuBaseConfig.__setattr__).
OPTION_ERROR_STYLE = "verbose"
WRAPS_CONFIG_ERRORS = True
# 9593780b:python/torchair/npu_fx_compiler.py:445 _npu_backend(gm, example_inputs, compiler_config=None,
# decompositions={}): no **kwargs. :474 get_npu_backend(*, compiler_config=None, custom_decompositions={}).
BACKEND_OPTIONS = None
# 9593780b:python/torchair/_ge_concrete_graph/ge_converter/custom/: npu_rms_norm.py:34,
# npu_add_rms_norm.py:34, npu_swiglu.py:32, npu_weight_quant_batchmatmul.py:37, quantmatmul.py:38,
# npu_dynamic_quant.py:14, transquantparam.py:31.
GE_CONVERTERS = frozenset({"npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_weight_quant_batchmatmul",
                           "npu_quant_matmul", "npu_dynamic_quant", "npu_trans_quant_param"})
# 9593780b:python/torchair/_ge_concrete_graph/fx2ge_converter.py:829
GE_ERROR = "Unsupported torch op {target} by ge"

RMS_NORM_DTYPES = {
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)}
UNVERIFIED = (
    "npu_rms_norm gamma dtype pairs and npu_swiglu's contiguity rule: op-plugin 6.0.0 has no docs folder; "
    "the tables of op-plugin 26.0.0 docs/zh/custom_APIs/torch_npu/ are applied",
    "npu_weight_quant_batchmatmul's K, N <= 65535 and the other INT8 dtype rules come from the 7.2.0 docs "
    "(and the 6.0.0 docs' quant_matmul table); their aclnn error texts are not in these sources",
    "aten ops are assumed to have GE converters; only the npu ops are checked",
)
