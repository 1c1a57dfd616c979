"""Chapter 00's own study (layer: chapter studies; taught in 00_environment_check): the tables that
chapter shows of the device, the dtype choice and the torch_npu line, built from the layers below."""
from __future__ import annotations

import os
import subprocess
import sys

# --- the device and the dtype choice (from backend and dtype_choice) -----------------------------

def environment_table(report: dict):
    """An ``environment_report`` as a two-column table (``fact``, ``value``), the way chapter 00
    shows it: a reader sees what is installed and what is missing without reading a dict. The
    memory row says whose memory it is (host RAM on a CPU, the device's own on an NPU / GPU)."""
    import pandas as pd

    props = report.get("device_properties") or {}
    on_cpu = str(report.get("device", "cpu")).startswith("cpu")
    memory = props.get("total_memory_bytes")
    rows = [("python", report.get("python")), ("torch", report.get("torch")),
            ("transformers", report.get("transformers")),
            ("torch_npu", report.get("torch_npu") or f"not loaded ({report.get('torch_npu_error')})"),
            ("CANN", report.get("cann") or "not found"), ("CUDA", report.get("cuda") or "not used"),
            ("device", report.get("device")), ("device name", props.get("name")),
            ("device count", props.get("count")),
            ("host RAM (GiB)" if on_cpu else "device memory (GiB)",
             round(memory / 2**30, 1) if memory else None),
            ("CPU", report.get("cpu_model")), ("torch threads", report.get("torch_threads")),
            ("workbook commit", report.get("workbook_commit"))]
    return pd.DataFrame(rows, columns=["fact", "value"]).astype({"value": str})


def dtype_probe_table(rows: list[dict], baseline: str = "float32"):
    """``dtype_choice.choose_dtype``'s timed rows with each dtype's request, decode-step and
    long-prefill times as ratios of ``baseline``'s, with the conservative spread of
    ``bench.speedup``: ``(candidate p10 / baseline p90, candidate p90 / baseline p10)``. The
    request's spread lies wholly below 1 exactly when ``dtype_choice.faster_beyond_spread`` holds,
    so ``decide.time_ratio_direction`` on it says what the choice saw. A row with a ``problem`` (a
    dtype that does not run correctly here) keeps it and no times."""
    import pandas as pd

    columns = ["dtype", "request_ms", "request_p10_ms", "request_p90_ms", "request_prompt_tokens",
               "request_new_tokens", "decode_ms", "decode_p10_ms", "decode_p90_ms", "decode_context_tokens",
               "prefill_short_tokens", "prefill_short_ms", "prefill_short_p10_ms", "prefill_short_p90_ms",
               "prefill_long_tokens", "prefill_long_ms", "prefill_long_p10_ms", "prefill_long_p90_ms",
               "timed_layers", "layers", "problem"]
    table = pd.DataFrame(rows, columns=columns)  # a row without times (a problem) gets NaN ratios
    base = next((r for r in rows if r["dtype"] == baseline), None)
    if base is not None:
        for phase in ("request", "decode", "prefill_long"):
            table[f"{phase}_time_ratio"] = table[f"{phase}_ms"] / base[f"{phase}_ms"]
            table[f"{phase}_ratio_low"] = table[f"{phase}_p10_ms"] / base[f"{phase}_p90_ms"]
            table[f"{phase}_ratio_high"] = table[f"{phase}_p90_ms"] / base[f"{phase}_p10_ms"]
    return table


def hub_endpoint_seen(variable: str = "HF_ENDPOINT", value: str = "https://hf-mirror.com") -> dict:
    """Which endpoint huggingface_hub uses when ``variable`` is set before / after importing it.

    Each case runs in a fresh interpreter (huggingface_hub reads its settings once, at import), so
    the notebook's own environment is never changed. Chapter 00 records the result.
    """
    setting, hub = f"os.environ[{variable!r}] = {value!r}", "import huggingface_hub.constants as c"
    env = {k: v for k, v in os.environ.items() if k != variable}
    seen = {}
    for when, first, second in (("before", setting, hub), ("after", hub, setting)):
        code = f"import os; {first}; {second}; print(c.ENDPOINT)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"huggingface_hub probe failed: {out.stderr.strip().splitlines()[-1:]}")
        seen[when] = out.stdout.strip()
    return {"before_import": seen["before"], "after_import": seen["after"],
            "read_before_import": seen["before"] == value.rstrip("/")}


# --- the torch_npu line and its graph modes (from versions and graph_modes) ----------------------
