"""torch_npu 2.1.0.post6 + CANN 8.0.RC2: the ``pytorch_2.1.0-cann_8.0.rc2-py_3.9-euler_2.10.7-aarch64-snt9b``
ModelArts image (legacy pinned set), with a torchair that has no ``CompilerConfig.mode``.

Built from Ascend/pytorch branch v2.1.0-6.0.rc2, whose submodules pin
Ascend/op-plugin b761d5824d7bc3f48033fe7120552cc2cfbce56d (branch 6.0.rc2) and
Ascend/torchair b5287801d273bc0f33a55d447ed8914d97ab64a2 (branch 6.0.rc2).
op-plugin's gencode.sh (b761d582:gencode.sh:44) reads ``op_plugin/config/$PYTORCH_VERSION_DIR/
op_plugin_functions.yaml``, i.e. v2r1 for torch 2.1 (the root yaml of that commit lacks
npu_dynamic_quant; v2r1 has it).
"""
import torch

NAME = "2.1.0.post6"
# Ascend/pytorch@master:COMPATIBILITY.en.md, historical table: "2.1.0.post6 | v2.1.0-6.0.rc2 | 2.1.0 | CANN 8.0.RC2"
TORCH_NPU_VERSION = "2.1.0.post6"
TORCH = "2.1.0"
CANN = "8.0.RC2"
IMAGE = "pytorch_2.1.0-cann_8.0.rc2-py_3.9-euler_2.10.7-aarch64-snt9b"
PYTORCH_BRANCH = "v2.1.0-6.0.rc2"
OP_PLUGIN = "Ascend/op-plugin@b761d582 (branch 6.0.rc2)"
TORCHAIR = "Ascend/torchair@b5287801 (branch 6.0.rc2)"

# --- torch_npu ops and their parameters (b761d582:op_plugin/config/v2r1/op_plugin_functions.yaml) --
OPS = {
    "npu_rms_norm": ("self", "gamma", "epsilon"),                                  # :2215
    "npu_add_rms_norm": ("x1", "x2", "gamma", "epsilon"),                          # :2211
    "npu_swiglu": ("input", "dim"),                                                # :2220 (Tensor self, int dim=-1)
    "npu_weight_quant_batchmatmul": ("x", "weight", "antiquant_scale", "antiquant_offset", "quant_scale",
                                     "quant_offset", "bias", "antiquant_group_size"),  # :2470, no inner_precise
    "npu_dynamic_quant": ("input", "smooth_scales"),                               # :2196, no group_index/dst_type
    "npu_trans_quant_param": ("scale", "offset"),                                  # :2476, no round_mode
    "npu_quant_matmul": ("x1", "x2", "scale", "offset", "pertoken_scale", "bias", "output_dtype"),  # :2478
}
# b761d582:op_plugin/ops/base_ops/opapi/QuantMatmulKernelNpuOpApi.cpp:102-107: None or int8 -> int8,
# float16, bfloat16; any other output_dtype leaves the TensorOptions default and aclnn rejects it.
QUANT_MATMUL_OUTPUT_DTYPES = (torch.int8, torch.float16, torch.bfloat16)

# --- torchair ----------------------------------------------------------------------------------
# b5287801:python/torchair/configs/compiler_config.py:19-34: no self.mode.
COMPILER_CONFIG_OPTIONS = ("debug", "aoe_config", "export", "dump_config", "fusion_config",
                           "experimental_config", "inference_config", "ge_config")
MODES = None
# b5287801:python/torchair/configs/_option_base.py:42 (repr style) and :108-113 (@pretty_error_msg
# around NpuBaseConfig.__setattr__: the message gains a traceback and an error code after the first line).
OPTION_ERROR_STYLE = "repr"
WRAPS_CONFIG_ERRORS = True
# b5287801:python/torchair/npu_fx_compiler.py:442 _npu_backend(gm, example_inputs, compiler_config=None,
# decompositions={}): no **kwargs. :471 get_npu_backend(*, compiler_config=None, custom_decompositions={}).
BACKEND_OPTIONS = None
# b5287801:python/torchair/ge_concrete_graph/ge_converter/custom/: npu_rms_norm.py:34,
# npu_add_rms_norm.py:34, npu_weight_quant_batchmatmul.py:35, quantmatmul.py:38,
# npu_dynamic_quant.py:13, transquantparam.py:31 register converters; no file registers npu_swiglu
# (git grep npu_swiglu in python/ finds nothing).
GE_CONVERTERS = frozenset({"npu_rms_norm", "npu_add_rms_norm", "npu_weight_quant_batchmatmul",
                           "npu_quant_matmul", "npu_dynamic_quant", "npu_trans_quant_param"})
# b5287801:python/torchair/ge_concrete_graph/fx2ge_converter.py:796
GE_ERROR = "Unsupported torch op {target} by ge"

RMS_NORM_DTYPES = {
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)}
UNVERIFIED = (
    "npu_rms_norm gamma dtype pairs and npu_swiglu's contiguity rule: op-plugin 6.0.rc2 has no docs "
    "folder; the tables of op-plugin 26.0.0 docs/zh/custom_APIs/torch_npu/ are applied",
    "npu_quant_matmul dtype combinations: the 6.0.0 docs table (hiascend Pytorch/600 ptaoplist_000858) "
    "is applied; a stricter 6.0.rc2 rule that bf16 output needs a bf16 scale could not be confirmed",
    "npu_weight_quant_batchmatmul / npu_dynamic_quant dtype rules come from the 6.0.RC1 and 7.2.0 docs; "
    "their aclnn error texts are not in these sources",
    "aten ops are assumed to have GE converters; only the npu ops are checked",
)
