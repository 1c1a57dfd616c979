"""torch_npu 2.7.1 + CANN 8.3.RC1 + torchair 7.2.0: the
``pytorch_2.7.1-cann_8.3.rc1-py_3.11-hce_2.0.2509-aarch64-snt9b`` ModelArts image (current pinned set).

Built from Ascend/pytorch branch v2.7.1-7.2.0, whose submodules pin
Ascend/op-plugin 30d4257003adc476db871394016bfb92e8e33dfa (branch 7.2.0) and
Ascend/torchair d20f4f9cd8915aa8170342c17560da13b0dcf4d2 (branch 7.2.0). From 7.x op-plugin has
one yaml for every torch line (op_plugin/config/op_plugin_functions.yaml, entries marked
all_version or [v2.1, newest]).
"""
import torch

NAME = "2.7.1"
# Ascend/pytorch@master:COMPATIBILITY.en.md: "2.7.1 | v2.7.1-7.2.0 | 2.7.1 | CANN 8.3.RC1"
TORCH_NPU_VERSION = "2.7.1"
TORCH = "2.7.1"
CANN = "8.3.RC1"
IMAGE = "pytorch_2.7.1-cann_8.3.rc1-py_3.11-hce_2.0.2509-aarch64-snt9b"
PYTORCH_BRANCH = "v2.7.1-7.2.0"
OP_PLUGIN = "Ascend/op-plugin@30d42570 (branch 7.2.0)"
TORCHAIR = "Ascend/torchair@d20f4f9c (branch 7.2.0)"

# --- torch_npu ops and their parameters (30d42570:op_plugin/config/op_plugin_functions.yaml) --------
OPS = {
    "npu_rms_norm": ("self", "gamma", "epsilon"),                                  # :6335
    "npu_add_rms_norm": ("x1", "x2", "gamma", "epsilon"),                          # :5560
    "npu_swiglu": ("input", "dim"),                                                # :6478
    "npu_weight_quant_batchmatmul": ("x", "weight", "antiquant_scale", "antiquant_offset", "quant_scale",
                                     "quant_offset", "bias", "antiquant_group_size", "inner_precise"),  # :6529
    "npu_dynamic_quant": ("input", "smooth_scales", "group_index", "dst_type"),    # :5841
    "npu_trans_quant_param": ("scale", "offset", "round_mode"),                    # :6511
    "npu_quant_matmul": ("x1", "x2", "scale", "offset", "pertoken_scale", "bias", "output_dtype",
                         "group_sizes"),                                           # :6257
}
# 30d42570:docs/context/torch_npu-npu_quant_matmul.md, output_dtype: int8, float16, bfloat16, int32 on A2.
QUANT_MATMUL_OUTPUT_DTYPES = (torch.int8, torch.float16, torch.bfloat16, torch.int32)

# --- torchair ----------------------------------------------------------------------------------
# d20f4f9c:python/torchair/configs/compiler_config.py:22-38
COMPILER_CONFIG_OPTIONS = ("debug", "aoe_config", "export", "dump_config", "fusion_config",
                           "experimental_config", "inference_config", "ge_config", "aclgraph_config")
MODES = ("max-autotune", "reduce-overhead")                                        # :36
# d20f4f9c:python/torchair/configs/_option_base.py:42-45: "Value 'x' (type: <class 'str'>) not in optional
# list [...] (type: <class 'str'>)."; :162-167 @pretty_error_msg around NpuBaseConfig.__setattr__.
OPTION_ERROR_STYLE = "verbose"
WRAPS_CONFIG_ERRORS = True
# d20f4f9c:python/torchair/npu_fx_compiler.py:586 _npu_backend(gm, example_inputs, compiler_config=None,
# decompositions={}): no **kwargs, so any torch.compile(options=...) key that torch does not pop is a
# TypeError. :623 get_npu_backend(*, compiler_config=None, custom_decompositions={}).
BACKEND_OPTIONS = None
# d20f4f9c:python/torchair/_ge_concrete_graph/ge_converter/custom/: npu_rms_norm.py:10,
# npu_add_rms_norm.py:4, npu_swiglu.py:8, npu_weight_quant_batchmatmul.py:4, quantmatmul.py:4,
# npu_dynamic_quant.py:4, transquantparam.py:10.
GE_CONVERTERS = frozenset({"npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_weight_quant_batchmatmul",
                           "npu_quant_matmul", "npu_dynamic_quant", "npu_trans_quant_param"})
# d20f4f9c:python/torchair/_ge_concrete_graph/fx2ge_converter.py:1113 (after trying to generate a
# converter for a custom op, _can_autogenerate_converter at :1353).
GE_ERROR = "Ascend op converter is not implemented of: {target}"

RMS_NORM_DTYPES = {
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)}
UNVERIFIED = (
    "npu_rms_norm gamma dtype pairs, npu_add_rms_norm and npu_swiglu rules: op-plugin 7.2.0's docs/context "
    "has no page for them; the tables of op-plugin 26.0.0 docs/zh/custom_APIs/torch_npu/ are applied",
    "the error texts of dtype rejections come from aclnn, whose messages are not in these sources",
    "aten ops are assumed to have GE converters; only the npu ops are checked",
)
