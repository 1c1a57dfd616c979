"""The guides' API names against the real ones (torch_npu, op-plugin, MindSpeed-LLM, bitsandbytes)
(layer: foundations; taught in 00_environment_check).

``00_environment_check.ipynb`` records ``api_check`` (live ``hasattr`` where
torch_npu imports); the claims audit of the report chapter reads that table, or the documented rows
here when chapter 00 did not run. Importing this module imports neither torch nor torch_npu.
"""
from __future__ import annotations

import sys

from .prose import N_
from .versions import has_attribute

# "documented" is what Ascend/pytorch and op-plugin sources say (shared reference npu_api.md);
# "here" is checked live with hasattr when torch_npu imports on this machine.
API_CLAIMS = [
    {"guide_name": "torch_npu.npu.rms_norm", "real_api": "torch_npu.npu_rms_norm",
     "documented": N_("does not exist; npu_rms_norm(x, gamma, epsilon) -> (y, rstd)")},
    {"guide_name": "torch_npu.npu.linear_activation", "real_api": "torch_npu.npu_swiglu",
     "documented": N_("does not exist; npu_swiglu(x, dim=-1) = silu(a) * b on the two halves "
                      "(also npu_ffn for a whole FFN)")},
    {"guide_name": "torch_npu.npu.fused_add_norm", "real_api": "torch_npu.npu_add_rms_norm",
     "documented": N_("does not exist; npu_add_rms_norm(x1, x2, gamma, epsilon) -> (y, rstd, x1 + x2)")},
    {"guide_name": "torch_npu.npu.layer_norm", "real_api": "torch_npu.npu_layer_norm_eval",
     "documented": N_("does not exist; aten layer_norm runs on NPU, npu_layer_norm_eval is the beta op")},
    {"guide_name": "torch.npu.config.enable_auto_mixed_precision", "real_api": "torch.autocast('npu')",
     "documented": N_("does not exist and assigning it is silently ignored; use torch.autocast")},
    {"guide_name": "torch.npu.config.allow_internal_format", "real_api": "torch.npu.config.allow_internal_format",
     "documented": N_("exists (set-only); default off on 910B/A2")},
    {"guide_name": "torch.compile(model, backend='npu')", "real_api": "torchair.get_npu_backend()",
     "documented": N_("exists: 'npu' is torchair's backend with the default config")},
    {"guide_name": "mindspeed_llm.Pipeline", "real_api": "MindSpeed-LLM inference.py via "
     "examples/mcore/llama2/generate_llama2_7b_ptd.sh", "documented": N_("does not exist; "
     "mindspeed_llm exports only megatron_adaptor")},
    {"guide_name": "BitsAndBytesConfig(load_in_8bit=True) on NPU",
     "real_api": "torch_npu.npu_weight_quant_batchmatmul (W8A16)",
     "documented": N_("no INT8 bitsandbytes backend on NPU; an 8-bit bnb model cannot be .to()-moved")},
]

def api_check(torch_npu_module=None) -> list[dict]:
    """Each guide API name: documented verdict, and a live hasattr check when torch_npu is here."""
    # torch is loaded whenever a torch_npu module is passed in
    roots = {"torch_npu": torch_npu_module, "torch": sys.modules.get("torch")}
    rows = []
    for claim in API_CLAIMS:
        name = claim["guide_name"]
        # only torch_npu's and torch.npu's names can be checked on this machine
        checkable = torch_npu_module is not None and name.startswith(("torch_npu.", "torch.npu."))
        root, _, rest = name.partition(".")
        exists = has_attribute(roots[root], rest) if checkable else None
        rows.append({**claim, "exists_here": exists})
    return rows
