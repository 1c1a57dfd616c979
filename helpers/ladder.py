"""The optimisation ladder of chapter 06: rungs measured side by side, the guide's table beside them.

Taught in ``06_optimization_ladder.ipynb``. A rung is a name, a description and a ``prepare``
callable that returns a model variant (or raises: the rung is then recorded as failed with its
error, and the ladder goes on). One ``measure`` callable turns each variant into metrics, so every
rung is timed the same way in the same run; speedups are ratios over the first rung that succeeded.

MindSpeed-LLM is detected, never assumed: when it is absent the chapter shows the exact commands for
an Ascend machine instead of a number. Serving engines (vLLM, vLLM-Ascend) are chapter 07's.
"""
from __future__ import annotations

import importlib.util
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

COLUMNS = ("rung", "description", "status", "latency_ms", "tokens_per_s", "peak_memory_bytes",
           "roofline_pct", "speedup", "speedup_low", "speedup_high", "error")


class RungSkipped(Exception):
    """Raise from ``prepare`` when a rung does not apply here (e.g. NPU runtime options on a CPU)."""


@dataclass
class Rung:
    name: str
    description: str
    prepare: Callable[[], Any]


def _as_rung(item) -> Rung:
    if isinstance(item, Rung):
        return item
    if isinstance(item, (tuple, list)) and len(item) == 3 and callable(item[2]):
        return Rung(str(item[0]), str(item[1]), item[2])
    raise ValueError(f"rung {item!r} is not valid; give Rung(name, description, prepare) or a "
                     "(name, description, prepare) tuple with a callable prepare")


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def run_ladder(rungs: Iterable, measure: Callable[[Any], dict], *,
               roofline_tok_s: Optional[float] = None,
               cleanup: Optional[Callable[[Any], None]] = None,
               on_rung: Optional[Callable[[dict], None]] = None):
    """Prepare and measure each rung; a failing rung is recorded and the ladder continues.

    ``measure(variant)`` returns a dict with at least ``latency_ms`` (for the whole request) and
    ``tokens_per_s``; optional ``peak_memory_bytes``, ``roofline_tok_s`` (overrides the ladder's, e.g.
    fewer weight bytes after INT8), ``batch_size`` and ``timing`` (a ``bench.Timing``: then the speedup
    and its spread come from ``bench.speedup``). Speedup is over the first rung that succeeded: the
    latency ratio at the same batch size, the throughput ratio when the batch differs (the guide's
    "+ best batch size" rung). Extra keys are kept as columns. ``cleanup(variant)`` frees a variant
    before the next rung; ``on_rung(row)`` sees each row as it is done (to record or print it).
    Returns a pandas DataFrame with ``COLUMNS`` first.
    """
    import pandas as pd

    from .bench import Timing, speedup

    rungs = [_as_rung(r) for r in rungs]
    if not rungs:
        raise ValueError("rungs is empty; give at least one (name, description, prepare) rung")
    names = [r.name for r in rungs]
    if len(set(names)) != len(names):
        raise ValueError(f"rung names must be unique, got {names}")
    rows: list[dict] = []
    baseline: Optional[dict] = None
    for rung in rungs:
        row: dict = {"rung": rung.name, "description": rung.description, "status": "ok", "error": ""}
        variant = None
        start = time.perf_counter()
        try:
            variant = rung.prepare()
            row["prepare_s"] = time.perf_counter() - start
            metrics = dict(measure(variant))
            for key in ("latency_ms", "tokens_per_s"):
                if key not in metrics:
                    raise KeyError(f"measure() returned no {key!r}; it returned {sorted(metrics)}")
            row.update(metrics)
        except RungSkipped as exc:
            row.update(status="skipped", error=str(exc))
        except Exception as exc:  # noqa: BLE001  (one broken rung must not stop the ladder)
            row.update(status="failed", error=_short_error(exc),
                       traceback=traceback.format_exc(limit=3))
        finally:
            if cleanup is not None and variant is not None:
                try:
                    cleanup(variant)
                except Exception:  # noqa: BLE001
                    pass
        if row["status"] == "ok":
            ceiling = row.get("roofline_tok_s", roofline_tok_s)
            row["roofline_pct"] = 100.0 * row["tokens_per_s"] / ceiling if ceiling else None
            if baseline is None:
                baseline = row
            same_batch = row.get("batch_size", 1) == baseline.get("batch_size", 1)
            if same_batch and isinstance(row.get("timing"), Timing) and isinstance(baseline.get("timing"), Timing):
                s = speedup(baseline["timing"], row["timing"])
                row.update(speedup=s.ratio, speedup_low=s.low, speedup_high=s.high)
            elif same_batch:
                row["speedup"] = baseline["latency_ms"] / row["latency_ms"]
            else:  # a bigger batch serves more users per call: compare throughput, not latency
                row["speedup"] = row["tokens_per_s"] / baseline["tokens_per_s"]
        rows.append(row)
        if on_rung is not None:
            on_rung(row)
    table = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in table.columns:
            table[col] = None
    if "timing" in table.columns:
        table["timing"] = table["timing"].map(lambda t: t.summary() if isinstance(t, Timing) else t)
    return table[list(COLUMNS) + [c for c in table.columns if c not in COLUMNS]]


def total_speedup(table) -> Optional[float]:
    """Speedup of the last successful rung over the first (None with fewer than two).

    Mixes kinds when the last rung changes the batch; chapter 06's headline figures are
    ``best_batch1_speedup`` and ``batch_throughput_ratio`` instead.
    """
    ok = table[table["status"] == "ok"]
    if len(ok) < 2:
        return None
    return float(ok["speedup"].iloc[-1])


def _ok_rows(table):
    ok = table[table["status"] == "ok"]
    if not len(ok):
        return ok, None
    batch = ok["batch_size"] if "batch_size" in ok else None
    base_batch = 1 if batch is None or batch.iloc[0] is None else batch.iloc[0]
    return ok, base_batch


def best_batch1_speedup(table) -> Optional[dict]:
    """The fastest rung at the baseline's batch (batch 1) over the baseline, a latency ratio.

    Returns ``{"rung", "speedup", "tokens_per_s", "baseline_tokens_per_s"}``, or None with no rung
    beyond the baseline. Rungs that change the batch never enter this figure.
    """
    ok, base_batch = _ok_rows(table)
    if len(ok) < 2:
        return None
    same = ok[ok["batch_size"].fillna(1) == base_batch] if "batch_size" in ok else ok
    best = same.iloc[same["tokens_per_s"].astype(float).values.argmax()]
    base = ok.iloc[0]
    return {"rung": best["rung"], "speedup": float(best["tokens_per_s"] / base["tokens_per_s"]),
            "tokens_per_s": float(best["tokens_per_s"]), "baseline_tokens_per_s": float(base["tokens_per_s"]),
            "batch_size": int(base_batch)}


def graph_count_problems(table, max_graphs: int = 2) -> list:
    """Graph rungs that built more than ``max_graphs`` graphs (one prefill and one decode graph per
    shape is the static path's promise); an empty list when every graph rung kept it."""
    if "compiled_graphs" not in table:
        return []
    problems = []
    for _, row in table[table["status"] == "ok"].iterrows():
        graphs = row["compiled_graphs"]
        if graphs is not None and graphs == graphs and graphs > max_graphs:
            problems.append(f"{row['rung']}: {int(graphs)} graphs built, more than {max_graphs} for one shape")
    return problems


def batch_throughput_ratio(table) -> Optional[dict]:
    """The last rung serving more users than the baseline: its aggregate tok/s over the baseline's.

    A throughput ratio (more users per call), never to be compared with a batch-1 latency ladder.
    """
    ok, base_batch = _ok_rows(table)
    if len(ok) < 2 or "batch_size" not in ok:
        return None
    bigger = ok[ok["batch_size"].fillna(1) > base_batch]
    if not len(bigger):
        return None
    row, base = bigger.iloc[-1], ok.iloc[0]
    return {"rung": row["rung"], "ratio": float(row["tokens_per_s"] / base["tokens_per_s"]),
            "tokens_per_s": float(row["tokens_per_s"]), "baseline_tokens_per_s": float(base["tokens_per_s"]),
            "batch_size": int(row["batch_size"])}


# --- building blocks for chapter 06's rungs ------------------------------------------------------

@dataclass
class Variant:
    """What a rung measures: a model, the batch of prompts (None: the ladder's) and the cache kind."""
    model: Any
    prompts: Optional[Sequence[str]] = None
    static_cache: bool = False


def generation_measure(tokenizer, prompts: Sequence[str], max_new_tokens: int, device, *,
                       bandwidth_gbps: Optional[float] = None, repeats: int = 3) -> Callable[[Any], dict]:
    """A ``measure`` for ``run_ladder`` built on ``helpers.generation.measure_generation``.

    A variant is a ``Variant``, a model, or ``(model, prompts)`` for a rung that changes the batch.
    ``latency_ms`` is one full ``generate`` of ``max_new_tokens``; ``tokens_per_s`` is the aggregate
    over the batch; the roofline is ``batch x bandwidth / weight bytes`` of that variant (memory-bound
    decode, KV cache ignored), so an INT8 rung gets its own, higher ceiling. A variant whose forward
    is compiled (``helpers.static_decode``) adds ``compiled_graphs`` and ``compile_s``.
    """
    from .generation import measure_generation
    from .models import weight_bytes

    def measure(variant) -> dict:
        if isinstance(variant, Variant):
            model, batch, static = variant.model, variant.prompts or prompts, variant.static_cache
        else:
            model, batch = variant if isinstance(variant, tuple) else (variant, prompts)
            static = False
        out = measure_generation(model, tokenizer, list(batch), max_new_tokens, device, repeats=repeats,
                                 static_cache=static)
        row = {"latency_ms": out["total_ms"], "tokens_per_s": out["tokens_per_s_aggregate"],
               "peak_memory_bytes": out.get("peak_memory_bytes"), "batch_size": out.get("batch_size"),
               "ttft_ms": out.get("ttft_ms"), "decode_ms_per_token": out.get("decode_ms_per_token"),
               "decode_p10_ms": out.get("decode_p10_ms"), "decode_p90_ms": out.get("decode_p90_ms"),
               "dtype": out.get("dtype"), "code_path": out.get("code_path"),
               "prompt_tokens": out.get("prompt_tokens"), "new_tokens": out.get("new_tokens"),
               "weight_bytes": weight_bytes(model),
               "compiled_graphs": out.get("compiled_graphs"), "compile_s": out.get("compile_s")}
        if bandwidth_gbps:
            row["roofline_tok_s"] = (out.get("batch_size") or len(batch)) * bandwidth_gbps * 1e9 / row["weight_bytes"]
        return row

    return measure


def apply_runtime_options(device, *, jit_compile: bool = False, allow_internal_format: bool = False) -> list[dict]:
    """The guide's 3.1 "CANN optimisation" switches: the real ones applied, the invented one exposed.

    Raises ``RungSkipped`` off an NPU (the options live in torch_npu). ``enable_auto_mixed_precision``
    is assigned exactly as the guide does, then shown to have been silently dropped: the assignment
    raises nothing and stores nothing, because torch_npu's config only knows allow_internal_format.
    """
    import torch

    kind = getattr(getattr(device, "device", device), "type", None) or str(device).split(":")[0]
    if kind != "npu":
        raise RungSkipped(f"runtime options exist only in torch_npu; this run is on {kind}")
    npu = torch.npu
    rows = []
    npu.set_compile_mode(jit_compile=jit_compile)
    rows.append({"option": f"torch.npu.set_compile_mode(jit_compile={jit_compile})", "status": "applied",
                 "note": "False uses the prebuilt binary kernels instead of compiling operators online"})
    npu.config.allow_internal_format = allow_internal_format
    rows.append({"option": f"torch.npu.config.allow_internal_format = {allow_internal_format}",
                 "status": "applied", "note": "set-only; already off by default on 910B/A2"})
    before = dict(vars(npu.config))
    npu.config.enable_auto_mixed_precision = True  # the guide's line, kept to show what it does
    stored = vars(npu.config) != before or "enable_auto_mixed_precision" in vars(npu.config)
    rows.append({"option": "torch.npu.config.enable_auto_mixed_precision = True",
                 "status": "stored (unexpected)" if stored else "silently ignored",
                 "note": "no such option: the assignment raised nothing and changed nothing; mixed precision "
                         "is torch.autocast('npu', dtype=torch.float16) or loading in float16"})
    return rows


# --- the guide's table (4.2 MindSpeed-LLM框架应用) ----------------------------------------------

# The guide's claim, not a measurement: Llama-2-7B fp16 on one 910B, 100 new tokens implied by
# 6012 ms at 16.6 tok/s. The MindSpeed rows cannot come from MindSpeed-LLM's inference script as
# the guide shows it (its Pipeline class does not exist).
GUIDE_LADDER = [
    {"rung": "原生PyTorch", "label": "native PyTorch", "latency_ms": 6012, "tokens_per_s": 16.6,
     "memory_gb": 13.6},
    {"rung": "+CANN优化", "label": "+ CANN options", "latency_ms": 4580, "tokens_per_s": 21.7,
     "memory_gb": 13.6},
    {"rung": "+MindSpeed", "label": "+ MindSpeed", "latency_ms": 3250, "tokens_per_s": 30.5,
     "memory_gb": 13.6},
    {"rung": "+MindSpeed+INT8", "label": "+ MindSpeed + INT8", "latency_ms": 2100, "tokens_per_s": 47.2,
     "memory_gb": 7.8},
]


def guide_ladder():
    """The guide's ladder with ratios to its own first row (labelled as the guide's claim)."""
    import pandas as pd

    table = pd.DataFrame(GUIDE_LADDER)
    base = table.iloc[0]
    table["speedup"] = base["latency_ms"] / table["latency_ms"]
    table["throughput_ratio"] = table["tokens_per_s"] / base["tokens_per_s"]
    table["memory_ratio"] = table["memory_gb"] / base["memory_gb"]
    table["source"] = "guide's claim (910B, Llama-2-7B fp16)"
    return table


def compare_with_guide(ours, label: str = "measured here"):
    """Both ladders as ratios to their own baselines, long format (source, label, speedup, memory_ratio).

    ``label`` is English (plot fonts often lack CJK glyphs); the guide's Chinese rung names stay in
    ``guide_ladder()``.
    """
    import pandas as pd

    guide = guide_ladder()[["label", "speedup", "memory_ratio", "source"]]
    ours = ours.copy()
    if "batch_size" in ours and ours["batch_size"].notna().any():
        # The guide's ladder is batch-1 latency: a rung serving more users stays out of this comparison.
        first = ours.loc[ours["status"] == "ok", "batch_size"]
        base_batch = first.iloc[0] if len(first) else 1
        ours = ours[ours["batch_size"].isna() | (ours["batch_size"] == base_batch)]
    ok = ours["status"] == "ok"
    base_mem = ours.loc[ok, "peak_memory_bytes"].iloc[0] if ok.any() else None
    ours["memory_ratio"] = ours["peak_memory_bytes"] / base_mem if base_mem else None
    ours["source"] = label
    ours["label"] = [r if s == "ok" else f"{r} ({s})" for r, s in zip(ours["rung"], ours["status"])]
    return pd.concat([guide, ours[["label", "speedup", "memory_ratio", "source"]]], ignore_index=True)


def plot_comparison(ours, label: str = "measured here", figsize=(9, 4)):
    """One chart: speedup over each ladder's own baseline, the guide's bars beside ours."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    data = compare_with_guide(ours, label)
    fig, ax = plt.subplots(figsize=figsize)
    colors = {src: c for src, c in zip(data["source"].unique(), ("#999999", "#1f77b4"))}
    heights = data["speedup"].astype(float).fillna(0.0)  # failed / skipped rungs: no bar, label says why
    ax.bar(range(len(data)), heights, color=[colors[s] for s in data["source"]])
    ax.set_xticks(range(len(data)), data["label"], rotation=30, ha="right", fontsize=8)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("batch-1 speedup over own baseline (x)")
    ax.set_title("Batch-1 optimisation ladder: the guide's claim vs this run")
    ax.legend(handles=[Patch(color=c, label=s) for s, c in colors.items()], fontsize=8)
    fig.tight_layout()
    return fig


# --- MindSpeed-LLM ---------------------------------------------------------------------------

MINDSPEED_COMMANDS = """\
# MindSpeed-LLM is a Megatron-based training suite; its inference is a validation script.
# Use a release branch that still ships the 7B script (1.0.RC3 ... 26.0.0; master keeps only 13B).
source /usr/local/Ascend/ascend-toolkit/set_env.sh   # or /usr/local/Ascend/cann/set_env.sh on CANN >= 8.5
git clone -b 2.3.0 <MindSpeed-LLM repository> && cd MindSpeed-LLM
# 1. convert the Hugging Face checkpoint to the mcore layout once (convert_ckpt.py, see the branch's docs)
# 2. set CHECKPOINT and TOKENIZER_PATH in the script; it passes --use-mcore-models --use-kv-cache
#    --use-flash-attn --use-fused-swiglu --use-fused-rmsnorm --fp16 --tensor-model-parallel-size 1
bash examples/mcore/llama2/generate_llama2_7b_ptd.sh
# 13B / 70B: the matching generate_llama2_*_ptd.sh with --tensor-model-parallel-size 2 / 8
"""

def detect_frameworks() -> list[dict]:
    """MindSpeed-LLM: installed or not, its real entry point, and the commands for an Ascend machine.

    Serving engines (vLLM, vLLM-Ascend, an endpoint such as MindIE) are chapter 07's
    (``helpers.serving``), which starts and measures them.
    """
    try:
        found = importlib.util.find_spec("mindspeed_llm") is not None
    except (ImportError, ValueError):
        found = False
    return [{"framework": "MindSpeed-LLM", "module": "mindspeed_llm",
             "status": "installed" if found else "not installed here",
             "entry_point": "inference.py via examples/mcore/llama2/generate_llama2_7b_ptd.sh",
             "commands": MINDSPEED_COMMANDS}]


def run_script(path: str, parameter: str = "script", timeout: float = 3600.0) -> dict:
    """Run a shell script as it is (e.g. MindSpeed-LLM's generate_llama2_7b_ptd.sh), timing its wall.

    The time includes everything the script does (checkpoint loading, distributed start-up), so it
    is reported apart from the ladder's rungs.
    """
    import subprocess
    from pathlib import Path

    script = Path(path).expanduser()
    if not script.is_file():
        raise ValueError(f"{parameter}={path!r} is not a file; give the path of a configured "
                         "generate script, or leave it empty")
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(script)], cwd=str(script.parent), capture_output=True,
                          text=True, timeout=timeout)
    wall = time.perf_counter() - start
    output = (proc.stdout + proc.stderr)[-3000:]
    if proc.returncode != 0:
        raise RuntimeError(f"{parameter}={path!r} exited with {proc.returncode}:\n{output}")
    return {"wall_s": wall, "returncode": proc.returncode, "output_tail": output}
