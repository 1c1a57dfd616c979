"""The CPU-class matrix: every path a per-CPU choice can open, run under every instruction-set class
this machine can be limited to.

Each class of x86-64 machine the workbook has met broke a path the suite had not run on the machine
it ran on: on an AVX2-only CPU the dtype pick, on an AVX-512 BF16 CPU the float16 path, on an AMX VM
llama.cpp. The choices are made by timing (``dtype_choice.measure_cpu_dtype``,
``quant.choose_cpu_w8a16_kernel``, ``quant.time_int4_activations``), so which path a machine takes
depends on its class. Here a child process is limited to each class that is not above this machine's
own (``ATEN_CPU_CAPABILITY`` for ATen's kernels, ``ONEDNN_MAX_CPU_ISA`` for oneDNN's) and runs, on a
tiny random Llama:

- the dtype choice itself (a decision it may make, a dtype that runs), and every dtype it can pick:
  a forward in float32, bfloat16 and float16 that agrees with float32 (or the reason it cannot run);
- the W8A16 kernel choice, and every INT8 kernel it can pick (int8pack, dequant, torchao), each
  quantized model agreeing with its dense one;
- the INT4 activation choice, and the INT4 model with every activation dtype it can pick.

The child also reports which class it really ran (ATen's capability; oneDNN's ISA and kernel names
from ``ONEDNN_VERBOSE``), so a limit that did not take is a failure, not a silent run of another class.
llama.cpp's paths (with and without its extra buffer types, and the retry after a crash) are in
``tests/test_llamacpp.py``: its build is for this CPU and cannot be limited the same way.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# name: (environment, ATen capability it must report, cpuinfo flags the machine needs, ISA names that
# must not appear in oneDNN's kernel names: those of the classes above it)
CLASSES = {
    "baseline x86-64": ({"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}, "DEFAULT", set(),
                        ("avx2", "avx512", "amx")),
    "AVX2 only": ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "AVX2", {"avx2"},
                  ("avx512", "amx")),
    "AVX-512": ({"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "AVX512",
                {"avx512f", "avx512bw", "avx512vl", "avx512dq"}, ("avx512_core_bf16", "amx")),
    "AVX-512 BF16": ({"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "AVX512",
                     {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}, ("amx",)),
    "AMX": ({"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "AVX512",
            {"avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_tile", "amx_bf16"}, ()),
}


def cpu_flags() -> set:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


# What the child runs under one class; prints one JSON line.
CHILD = textwrap.dedent('''
    import copy, json, torch
    from helpers import dtype_choice, model_files, quant
    from helpers.backend import dtype_name

    def agreement(got, ref):
        got, ref = got.float().flatten(), ref.float().flatten()
        return float(torch.nn.functional.cosine_similarity(got, ref, dim=0))

    torch.manual_seed(0)
    ids = torch.randint(3, 200, (1, 12))
    out = {"capability": str(torch.backends.cpu.get_cpu_capability()), "dtypes": {}}
    base, _ = model_files.tiny_llama(seed=0, hidden_size=128, intermediate_size=256)
    with torch.inference_mode():
        reference = base(ids).logits
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        row = out["dtypes"][dtype_name(dtype)] = {"problem": dtype_choice.dtype_problem(dtype)}
        if row["problem"]:
            continue
        model = copy.deepcopy(base).to(dtype)
        with torch.inference_mode():
            dense = model(ids).logits
        row["agreement"] = agreement(dense, reference)
        rows = quant.time_w8a16_kernels(model, kernels=quant.W8A16_CPU_KERNELS, min_iters=2, min_seconds=0.0)
        row["int8_pick"] = quant.pick_w8a16_kernel(rows)["kernel"]
        row["int8"] = {}
        for kernel in [r["kernel"] for r in rows if not r["kernel"].startswith("dense") and not r.get("problem")]:
            q = copy.deepcopy(model)
            if kernel == "torchao":
                quant.torchao_int8_weight_only(q)
            else:
                quant.quantize_model_int8(q, impl=kernel)
            with torch.inference_mode():
                row["int8"][kernel] = agreement(q(ids).logits, dense)
        row["int8_problems"] = {r["kernel"]: str(r["problem"]) for r in rows if r.get("problem")}
        found = quant.time_int4_activations(model, min_iters=2, min_seconds=0.0)
        row["int4_pick"] = dtype_name(found["act_dtype"])
        row["int4"] = {}
        for r in found["rows"]:
            if r.get("problem") or r["kernel"].startswith("dense"):
                continue
            q = copy.deepcopy(model)
            quant.quantize_model_int4(q, act_dtype=getattr(torch, r["activations"]))
            with torch.inference_mode():
                row["int4"][r["activations"]] = agreement(q(ids).logits, dense)
    choice = dtype_choice.measure_cpu_dtype(base, budget=64 * 2**20, rounds=1, decode_iters=1, prefill_iters=1,
                                            probe_prompts=(4, 8), prompt_tokens=8, new_tokens=4)
    out["choice"] = {"dtype": dtype_name(choice.dtype), "decision": choice.decision,
                     "capability": choice.cpu_capability}
    print("CLASS " + json.dumps(out))
''')


def run_class(env: dict) -> tuple[dict, str]:
    """The child's report and oneDNN's verbose lines, under ``env``."""
    full = {**os.environ, **env, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("CLASS "))
    verbose = "\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith("onednn_verbose"))
    return json.loads(line[len("CLASS "):]), verbose


@pytest.mark.parametrize("name", list(CLASSES))
def test_every_path_a_choice_can_open_runs_under_each_cpu_class(name):
    env, capability, needs, above = CLASSES[name]
    missing = needs - cpu_flags()
    if missing:
        pytest.skip(f"this CPU has no {', '.join(sorted(missing))}: the {name} class is above it")
    report, verbose = run_class(env)

    # the limit took: ATen's kernels and oneDNN's are this class's, not the machine's own
    assert report["capability"] == capability, report
    assert report["choice"]["capability"] == capability
    # onednn_verbose,v1,primitive,exec,cpu,<primitive>,<implementation, e.g. brg_matmul:avx512_core_bf16>,...
    kernels = [ln.split(",")[6] for ln in verbose.splitlines() if ",primitive,exec," in ln]
    isa = [ln for ln in verbose.splitlines() if ",info,cpu,isa:" in ln]
    for word in above:
        assert not any(word in k.lower() for k in kernels), (name, word, sorted(set(kernels)))
    if name == "AMX":
        assert any("amx" in k for k in kernels), (isa, sorted(set(kernels)))

    # the dtype choice decides, and picks a dtype that runs here
    assert report["choice"]["decision"] in ("16bit_faster", "float32_not_slower", "no_16bit_usable")
    assert report["choice"]["dtype"] in [d for d, row in report["dtypes"].items() if not row["problem"]]
    assert not report["dtypes"]["float32"]["problem"]
    for dtype, row in report["dtypes"].items():
        if row["problem"]:
            continue  # a reason, which chapter 00 prints; the choice never picks it (above)
        where = f"{name}, {dtype}"
        assert row["agreement"] > 0.995, (where, row)
        # every INT8 kernel the choice can pick runs and agrees with the dense model; the pick is one of them
        assert row["int8_pick"] in row["int8"], (where, row)
        assert row["int8"] and min(row["int8"].values()) > 0.99, (where, row)
        # INT4 with every activation dtype the choice can pick
        assert row["int4_pick"] in row["int4"], (where, row)
        assert min(row["int4"].values()) > 0.9, (where, row)
