"""torch_npu 2.1.0 + CANN 7.0.0: the first torch 2.1 release line, with only ``npu_rms_norm``.

Built from Ascend/pytorch branch v2.1.0-5.0.0, whose submodules pin
Ascend/op-plugin cd46cfb2d372ed80fb81d40755b317a36bd499c9 (branch 5.0.0) and
Ascend/torchair 702161d70035b57a471d923bd5b72266c9a0a65f (third_party/torchair/torchair).
op-plugin's gencode.sh (cd46cfb2:gencode.sh:33) generates the bindings from
``op_plugin/config/$PYTORCH_VERSION_DIR/op_plugin_functions.yaml``, i.e. v2r1 for torch 2.1.
No ModelArts image name with this torch_npu was found; it stands for any image built on it.
"""
import torch

NAME = "2.1.0"
# Ascend/pytorch@master:COMPATIBILITY.en.md, historical table: "2.1.0 | v2.1.0-5.0.0 | 2.1.0 | CANN 7.0.0"
TORCH_NPU_VERSION = "2.1.0"
TORCH = "2.1.0"
CANN = "7.0.0"
PYTORCH_BRANCH = "v2.1.0-5.0.0"
OP_PLUGIN = "Ascend/op-plugin@cd46cfb2 (branch 5.0.0)"
TORCHAIR = "Ascend/torchair@702161d7"

# --- torch_npu ops and their keyword parameters (Python binding = the yaml signature) -----------
# cd46cfb2:op_plugin/config/v2r1/op_plugin_functions.yaml:2113
#   npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
# The same file has no npu_add_rms_norm, npu_swiglu, npu_weight_quant_batchmatmul, npu_quant_matmul,
# npu_dynamic_quant or npu_trans_quant_param (grep of every func: line).
OPS = {
    "npu_rms_norm": ("self", "gamma", "epsilon"),
}
# Ascend/pytorch@v2.1.0-5.0.0:torch_npu/npu/__init__.py __all__ has no "mem_get_info" (it is in
# v2.1.0-6.0.rc2's, line 13).
HAS_MEM_GET_INFO = False

# --- torchair ----------------------------------------------------------------------------------
# 702161d7:python/torchair/configs/compiler_config.py:14-26: CompilerConfig.__init__ sets debug,
# aoe_config, export_config, dump_config, fusion_config, experimental_config; no mode.
COMPILER_CONFIG_OPTIONS = ("debug", "aoe_config", "export_config", "dump_config", "fusion_config",
                           "experimental_config")
MODES = None
# 702161d7:python/torchair/configs/option_base.py:40: "'" + str(v) + "' not in optional list " + str(...)
OPTION_ERROR_STYLE = "str"
# 702161d7:python/torchair/configs/option_base.py:59-63: NpuBaseConfig.__setattr__ raises
# ValueError("CompilerConfig has no option mode, all options [...]"), not wrapped (no pretty_error_msg).
WRAPS_CONFIG_ERRORS = False
# 702161d7:python/torchair/npu_fx_compiler.py:356-376: _npu_backend(gm, example_inputs,
# compiler_config=None, aot_config=None, custom_decompositions={}) takes no **kwargs;
# get_npu_backend(*, compiler_config=None, aot_config=None, custom_decompositions={}).
BACKEND_OPTIONS = None
GET_NPU_BACKEND_TAKES_AOT_CONFIG = True
# 702161d7:python/torchair/ge_concrete_graph/ge_converter/custom/ holds flash_attention.py,
# npu_rotary_mul.py and scatter_update.py only: no converter for npu_rms_norm.
GE_CONVERTERS = frozenset()
# 702161d7:python/torchair/ge_concrete_graph/fx2ge_converter.py:404
GE_ERROR = "Unsupported torch op {target} by ge"

# --- constraints this line's sources do not state ----------------------------------------------
# op-plugin 5.0.0 has no docs folder; the kernels (op_plugin/ops/base_ops/opapi/RmsNormKernelOpApi.cpp)
# check nothing themselves. The fake applies the dtype table of the 26.0.0 docs.
RMS_NORM_DTYPES = {
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)}
UNVERIFIED = (
    "npu_rms_norm gamma dtype pairs: the table of op-plugin 26.0.0 docs/zh/custom_APIs/torch_npu/"
    "（beta）torch_npu-npu_rms_norm.md is applied; this line has no docs in op-plugin",
    "the error texts of dtype/shape rejections come from aclnn, whose messages are not in these sources",
    "aten ops are assumed to have GE converters; only the npu ops are checked",
)
