"""torch_npu 2.9.0.post2 + CANN 9.0.0 + torchair 26.0.0: the current line, where torchair's
``CompilerConfig.mode`` offers ``npugraph_ex`` and ``reduce-overhead`` is deprecated.

Built from Ascend/pytorch branch v2.9.0-26.0.0, whose submodules pin
Ascend/op-plugin 6ffd6e22ad4ea0fe6f20d6c8d249b772e92191d4 (branch 26.0.0) and
Ascend/torchair efaf12d3d78e462df953c3da9d9ef689fb4c78b0. That torchair commit is not in the stored
copy of Ascend/torchair; the torchair facts below are read at the tip of its branch 26.0.0,
7c6c754bed00c86ffaaa2a45cb7ac2724f058013 (2026-04-23). No ModelArts image name with this
torch_npu was found; ``verl-0.8.0-pytorch_2.9.0-cann_8.5.1-...`` carries the 2.9.0 / 7.3.0 line instead.
"""
import torch

NAME = "2.9.0.post2"
# Ascend/pytorch@master:COMPATIBILITY.en.md: "2.9.0.post2 | v2.9.0-26.0.0 | 2.9.0 | CANN 9.0.0"
TORCH_NPU_VERSION = "2.9.0.post2"
TORCH = "2.9.0"
CANN = "9.0.0"
PYTORCH_BRANCH = "v2.9.0-26.0.0"
OP_PLUGIN = "Ascend/op-plugin@6ffd6e22 (branch 26.0.0)"
TORCHAIR = "Ascend/torchair@7c6c754b (branch 26.0.0 tip; the pinned efaf12d3 is not stored)"

# --- torch_npu ops and their parameters (6ffd6e22:op_plugin/config/op_plugin_functions.yaml) --------
OPS = {
    "npu_rms_norm": ("self", "gamma", "epsilon"),                                  # :6630
    "npu_add_rms_norm": ("x1", "x2", "gamma", "epsilon"),                          # :5596
    "npu_swiglu": ("input", "dim"),                                                # :6779
    "npu_weight_quant_batchmatmul": ("x", "weight", "antiquant_scale", "antiquant_offset", "quant_scale",
                                     "quant_offset", "bias", "antiquant_group_size", "inner_precise",
                                     "weight_dtype"),                              # :6841
    "npu_dynamic_quant": ("input", "smooth_scales", "group_index", "dst_type", "quant_mode",
                          "dst_type_max"),                                         # :5906
    "npu_trans_quant_param": ("scale", "offset", "round_mode"),                    # :6823
    "npu_quant_matmul": ("x1", "x2", "scale", "offset", "pertoken_scale", "bias", "output_dtype",
                         "x1_dtype", "x2_dtype", "pertoken_scale_dtype", "scale_dtype", "group_sizes",
                         "y_scale"),                                               # :6552
}
# 6ffd6e22:docs/zh/custom_APIs/torch_npu/torch_npu-npu_quant_matmul.md:60-76
QUANT_MATMUL_OUTPUT_DTYPES = (torch.int8, torch.float16, torch.bfloat16, torch.int32)

# --- torchair (7c6c754b) ------------------------------------------------------------------------
# python/torchair/configs/compiler_config.py:24-46 (post_grad_custom_* are appended to _fixed_attrs)
COMPILER_CONFIG_OPTIONS = ("debug", "aoe_config", "export", "dump_config", "fusion_config",
                           "experimental_config", "inference_config", "ge_config", "aclgraph_config",
                           "npugraphex_config", "post_grad_custom_pre_pass", "post_grad_custom_post_pass")
MODES = ("max-autotune", "reduce-overhead", "npugraph_ex")                         # :39
# compiler_config.py:110-114: get_npu_backend's _check_config_support warns (DeprecationWarning)
# 'The "reduce-overhead" mode configuration will be deprecated. Please use the "npugraph_ex" backend.'
# docs/zh/overview.md:43: from torch_npu 7.3.0 on, reduce-overhead via config.mode "将不再演进".
REDUCE_OVERHEAD_DEPRECATED = True
OPTION_ERROR_STYLE = "verbose"                                                     # _option_base.py:44-46
WRAPS_CONFIG_ERRORS = True                                                         # _option_base.py:221
# python/torchair/npu_fx_compiler.py:860 _npu_backend(..., **kwargs) hands torch.compile's options to
# _process_kwargs_options (:878), which accepts only the keys of _NpuGraphExConfig.OPTIONS_TO_CONFIG_MAP
# (configs/npugraphex_config.py:34-60) and raises ValueError "Invalid option '<k>', allowed options:
# [...]" (:107) for any other.
BACKEND_OPTIONS = frozenset({
    "_vllm_aclnn_static_kernel_sym_index", "_vllm_aclnn_static_kernel_sym_range", "static_kernel_compile",
    "super_kernel_optimize", "super_kernel_optimize_options", "super_kernel_debug_options", "inplace_pass",
    "input_inplace_pass", "remove_noop_ops", "remove_cat_ops", "force_eager", "pattern_fusion_pass",
    "clone_input", "frozen_parameter", "post_grad_custom_pre_pass", "post_grad_custom_post_pass",
    "use_graph_pool", "reuse_graph_pool_in_same_fx", "capture_limit", "clone_output", "dump_tensor_data",
    "data_dump_stage", "data_dump_dir"})
# python/torchair/_ge_concrete_graph/ge_converter/custom/: npu_rms_norm.py:10, npu_add_rms_norm.py:4,
# npu_swiglu.py:8, npu_weight_quant_batchmatmul.py:27, quantmatmul.py:38, npu_dynamic_quant.py:8,
# transquantparam.py:10.
GE_CONVERTERS = frozenset({"npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_weight_quant_batchmatmul",
                           "npu_quant_matmul", "npu_dynamic_quant", "npu_trans_quant_param"})
GE_ERROR = "Ascend op converter is not implemented of: {target}"                  # fx2ge_converter.py:652

# 6ffd6e22:docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_rms_norm.md, 约束说明 (A2/A3 table)
RMS_NORM_DTYPES = {
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)}
UNVERIFIED = (
    "torchair facts are read at the 26.0.0 branch tip, not at the commit torch_npu pins (not stored)",
    "the error texts of dtype rejections come from aclnn, whose messages are not in these sources",
    "aten ops are assumed to have GE converters; only the npu ops are checked",
)
