"""Chapter 00's own study (layer: chapter studies; taught in 00_environment_check): the tables that
chapter shows of the device, the dtype choice and the torch_npu line, built from the layers below."""
from __future__ import annotations

# --- the device and the dtype choice (from backend and dtype_choice) -----------------------------


# --- the torch_npu line and its graph modes (from versions and graph_modes) ----------------------
