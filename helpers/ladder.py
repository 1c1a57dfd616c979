"""The optimisation ladder of chapter 06: what the chapter records and decides from the rungs'
table, the references beside it (llama.cpp, float32 eager, the guide's table) and the measure the
rounds call (layer: chapter studies; taught in 06_optimization_ladder). The rungs themselves are
``helpers.rungs``; the engine that prepares and times them is ``helpers.round_robin``; MindSpeed-LLM
is ``helpers.mindspeed``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import torch

from . import claims, decide, decode_loop, llamacpp, profiling, static_decode
from .backend import as_device
from .bench import Timing
from .decide import SAME, direction, met
from .generation import decode_bytes_per_step, pool_runs, generate_tokens, measure_generation
from .model_files import EMBEDDED_MODEL, local_gguf, locate_embedded_gguf
from .models import chat_inputs, weight_bytes
from .prose import Message, N_, message
from .quality import encode, evaluate, load_heldout_text
from .quant import pick_w8a16_kernel
from .round_robin import RungSkipped

# The words of this chapter's tables (column names, categories in cells): ``prose.show`` translates
# them on the page through the runtime catalog; the recorded tables keep the English.
TABLE_WORDS = (
    N_("the change it adds"), N_("description"), N_("latency_ms"), N_("speedup_low"), N_("speedup_high"),
    N_("speedup_over"), N_("roofline_share"), N_("vs_llamacpp"), N_("vs_llamacpp_low"),
    N_("vs_llamacpp_high"), N_("vs_float32_eager"), N_("other_ms"), N_("framework_ms"), N_("format"),
    N_("memory_gb"), N_("implied_new_tokens"), N_("memory_ratio"), N_("framework"), N_("entry_point"),
    N_("compiled_graphs"), N_("compile_s"), N_("step_ratio"), N_("prepare_s"), N_("option"), N_("applied"),
    N_("silently ignored"), N_("stored (unexpected)"), N_("installed"), N_("not installed here"),
    N_("measured here"), N_("native PyTorch"), N_("+ CANN options"), N_("+ MindSpeed"),
    N_("+ MindSpeed + INT8"), N_("previous"), N_("fused then int8"), N_("int8 then fused"), N_("+ fused"),
    N_("+ int8"), N_("both"),
)


def _known(value) -> bool:
    """Not None and not NaN (pandas turns a gap in a numeric column into NaN)."""
    return value is not None and value == value


def _ok_rows(table):
    """The ok rungs and the baseline's batch size (None without an ok rung)."""
    ok = table[table["status"] == "ok"]
    if not len(ok):
        return ok, None
    batch = ok["batch_size"] if "batch_size" in ok else None
    return ok, 1 if batch is None or batch.iloc[0] is None else batch.iloc[0]


def _batch1(table):
    """The ok rungs that decode one sequence (a rung without a batch size is batch 1)."""
    ok = table[table["status"] == "ok"]
    return ok[ok["batch_size"].fillna(1).astype(int) == 1] if "batch_size" in ok else ok


def _float(value) -> float:
    return float(value) if _known(value) else math.nan


def _per_s(decode_ms, batch) -> Optional[float]:
    """Tokens per second of ``batch`` sequences at ``decode_ms`` per step (None when unknown)."""
    ms = _float(decode_ms)
    return 1e3 * (int(batch) if _known(batch) else 1) / ms if ms > 0 else None


def best_batch1_speedup(table) -> Optional[dict]:
    """The batch-1 rung with the highest speedup over the baseline, and what may be said of it.

    The speedup is the table's own column, so the headline and the table show the same ratio;
    "best" is ``best_gain`` on the rungs' decode p10-p90 ranges (``decision``: ``best,
    clear``, ``best, tied`` with ``tied`` naming the rungs within its noise, or ``no gain beyond the
    noise``). None with no rung beyond the baseline; rungs changing the batch never enter it.
    """
    ok, base_batch = _ok_rows(table)
    same = ok[ok["batch_size"].fillna(1) == base_batch] if "batch_size" in ok else ok
    if len(ok) < 2 or len(same) < 2:
        return None

    def option(row) -> tuple:  # decode tok/s from ms per token: p90 of the time is p10 of the speed
        return (row["rung"], float(row["tokens_per_s"]), _float(_per_s(row.get("decode_p90_ms"), 1)),
                _float(_per_s(row.get("decode_p10_ms"), 1)))

    # the fewest decode samples of any rung compared (the per-token samples its spread comes from)
    samples = _fewest_samples(r for _, r in same.iterrows())
    found = best_gain([option(r) for _, r in same.iloc[1:].iterrows()], option(same.iloc[0]), samples=samples)
    if found is None:
        return None
    best, base = same[same["rung"] == found.best].iloc[0], ok.iloc[0]
    return {"rung": found.best, "speedup": _float(best["speedup"]),
            "low": _float(best.get("speedup_low")), "high": _float(best.get("speedup_high")),
            "decision": found.decision, "tied": found.tied, "n_samples": samples,
            "tokens_per_s": float(best["tokens_per_s"]),
            "baseline_tokens_per_s": float(base["tokens_per_s"]), "batch_size": int(base_batch)}


def ladder_steps(table) -> list[dict]:
    """Each ok batch-1 rung against the ok batch-1 rung before it: ``decode_ratio`` (above 1: the
    rung decodes faster) with the spread of both, for a sentence per step decided on the spreads."""
    ok = _batch1(table)
    rows = []
    for (_, before), (_, row) in zip(ok.iloc[:-1].iterrows(), ok.iloc[1:].iterrows()):
        found = decode_ratio(row, before)
        if found:
            rows.append({"rung": row["rung"], "rung_id": row.get("rung_id"), "previous": before["rung"],
                         **found})
    return rows


def graph_count_problems(table, max_graphs: int = 2) -> list:
    """Graph rungs that built more than ``max_graphs`` graphs (one prefill and one decode graph per
    shape is the static path's promise); an empty list when every graph rung kept it."""
    if "compiled_graphs" not in table:
        return []
    ok = table[table["status"] == "ok"]
    over = ok[ok["compiled_graphs"].fillna(0) > max_graphs]  # an eager rung built none
    return [f"{rung}: {int(graphs)} graphs built, more than {max_graphs} for one shape"
            for rung, graphs in zip(over["rung"], over["compiled_graphs"])]


def batch_throughput_ratio(table) -> Optional[dict]:
    """The last rung serving more users than the baseline: its aggregate tok/s over that of the ok
    batch-1 rung just before it (``over``: the same weights and code path, only the batch changed,
    so the ratio is batching's alone), never to be compared with a batch-1 latency speedup."""
    ok, base_batch = _ok_rows(table)
    if len(ok) < 2 or "batch_size" not in ok:
        return None
    sizes = ok["batch_size"].fillna(1)
    bigger = ok[sizes > base_batch]
    if not len(bigger):
        return None
    row = bigger.iloc[-1]
    position = list(ok.index).index(bigger.index[-1])
    before = ok.iloc[:position][sizes.iloc[:position] == base_batch]
    if not len(before):
        return None
    base = before.iloc[-1]
    return {"rung": row["rung"], "ratio": float(row["tokens_per_s"] / base["tokens_per_s"]),
            "tokens_per_s": float(row["tokens_per_s"]), "baseline_tokens_per_s": float(base["tokens_per_s"]),
            "over": base["rung"], "weights": row.get("dtype"), "batch_size": int(row["batch_size"])}


COUNT_COLUMNS = ("batch_size", "prompt_tokens", "new_tokens", "compiled_graphs")  # recorded as integers


def ladder_rows(table) -> list[dict]:
    """The ladder table as recorded: counts as whole numbers (pandas holds a column with gaps as
    floats; a template shows "2 graphs", not "2.00 graphs")."""
    # n_samples: the pooled decode count (decode_sample_count), which decide.samples_of reads
    # before the row's rounds
    return [{**{k: (int(v) if _known(v) else None) if k in COUNT_COLUMNS else v for k, v in row.items()},
             "n_samples": decode_sample_count(row)} for row in table.to_dict("records")]


def record_ladder_figures(ch, table, new_tokens: int) -> None:
    """Chapter 06's figures from the ladder table, on one batch-1 protocol: each ok rung's tok/s
    (``ladder_tok_s_<rung>``, with its prompt and new tokens), the best batch-1 rung as
    ``best_batch1_speedup`` decides it (the table's own ratio, with its spread), the batch rung's
    throughput ratio, the graph counts and each batch-1 step (``ladder_steps``). ``ch`` is the
    chapter (``helpers.chapter.Chapter``)."""
    rows = ladder_rows(table)
    ch.results.table("ladder", rows)
    for row in (r for r in rows if r["status"] == "ok"):
        extra = {k: row[k] for k in ("compiled_graphs", "compile_s") if _known(row.get(k))}
        batch, prompt_tokens = row.get("batch_size"), row.get("prompt_tokens")
        # the spread in the figure's own unit: tok/s of the decode p90 (slow) and p10 (fast) step times
        low, high = (_per_s(row.get(key), batch) for key in ("decode_p90_ms", "decode_p10_ms"))
        ch.record(f"ladder_tok_s_{row['rung'].strip('+ ').replace(' ', '_')}", row["tokens_per_s"], "tok/s",
                  dtype=row.get("dtype"), shape=message("batch {batch}, {prompt}-token prompt, {new} new tokens",
                                                        batch=batch, prompt=prompt_tokens, new=new_tokens),
                  code_path=row.get("code_path") or row["description"], rung=row["rung"],
                  prompt_tokens=prompt_tokens, new_tokens=row.get("new_tokens"), batch_size=batch,
                  low=low, high=high, n_samples=row["n_samples"], **extra)
    best = best_batch1_speedup(table)
    if best is not None:
        ch.record("ladder_best_batch1_speedup", best["speedup"], "x", key_figure=True,
                  shape=message("batch 1, {new} new tokens, rung {rung!r} vs native eager", new=new_tokens,
                                rung=best["rung"]),
                  code_path=message("the table's speedup: decode tok/s of the batch-1 rung with the highest median "
                                    "over native eager's, same run, p10-p90 spread from bench.speedup"),
                  **{k: best[k] for k in ("rung", "low", "high", "decision", "tied", "n_samples", "tokens_per_s",
                                          "baseline_tokens_per_s")})
    batch = batch_throughput_ratio(table)
    if batch is not None:
        ch.record("ladder_batch_throughput_ratio", batch["ratio"], "x", key_figure=True, dtype=batch["weights"],
                  shape=message("batch {batch} vs batch 1, {new} new tokens", batch=batch["batch_size"], new=new_tokens),
                  code_path=message("aggregate tokens/s of the batch rung over batch-1 tokens/s of {over!r}, the rung "
                                    "it builds on (same weights and code path), same run", over=batch["over"]),
                  **{k: batch[k] for k in ("rung", "batch_size", "tokens_per_s", "baseline_tokens_per_s", "over")})
    problems = graph_count_problems(table)
    for problem in problems:
        ch.results.note(problem)
    ch.record("graph_count_problems", len(problems), "rungs", problems=problems,
              code_path="ladder.graph_count_problems: more than two graphs for one shape")
    ch.results.table("ladder_steps", ladder_steps(table))


# The columns chapter 06 shows: the ladder, then the references and the split of each step.
LADDER_COLUMNS = ("rung", "status", "dtype", "batch_size", "prompt_tokens", "new_tokens", "latency_ms", "tokens_per_s",
                  "decode_ms_per_token", "decode_p10_ms", "decode_p90_ms", "decode_samples", "speedup", "speedup_low",
                  "speedup_high", "speedup_over", "bytes_per_step", "achieved_gbps", "roofline_share",
                  "compiled_graphs", "compile_s", "peak_memory_bytes", "error")
ROOFLINE_COLUMNS = ("rung", "dtype", "batch_size", "tokens_per_s", "decode_ms_per_token", "bytes_per_step",
                    "achieved_gbps", "roofline_share")


def roofline_rows(table, llama: Optional[dict] = None) -> list[dict]:
    """Each ok rung and llama.cpp against one limit: bytes per decode step, the GB/s that step
    reaches and its share of the measured read bandwidth (``roofline_share``), one row each."""
    rows = [{k: row.get(k) for k in ROOFLINE_COLUMNS} for row in ladder_rows(table) if row["status"] == "ok"]
    if llama and llama.get("status") == "ok" and llama.get("bytes_per_step"):
        rows.append({"rung": "llama.cpp", "dtype": f"{llama.get('quantization')} weights (GGUF)", "batch_size": 1,
                     "tokens_per_s": llama["tokens_per_s"], "decode_ms_per_token": llama["decode_ms_per_token"],
                     "bytes_per_step": llama["bytes_per_step"], "achieved_gbps": llama.get("achieved_gbps"),
                     "roofline_share": llama.get("roofline_share")})
    return rows


def roofline_runs(rows: list, bandwidth_gbps: Optional[float]) -> list:
    """``roofline_rows`` as ``plots.plot_roofline``'s runs: per row its decode tok/s (aggregate), the
    tok/s its bytes per step allow at the measured bandwidth, and its share of that ceiling."""
    runs = []
    for r in rows:
        batch = r.get("batch_size") or 1
        ceiling = batch * bandwidth_gbps * 1e9 / r["bytes_per_step"] if bandwidth_gbps and r.get("bytes_per_step") else None
        share = r.get("roofline_share")
        runs.append((f"{r['rung']} ({r.get('dtype')}, batch {batch})", r.get("tokens_per_s"), ceiling,
                     100 * share if _known(share) else None))
    return runs
REFERENCE_COLUMNS = ("rung", "status", "tokens_per_s", "decode_ms_per_token", "ttft_ms", "vs_llamacpp",
                     "vs_llamacpp_low", "vs_llamacpp_high", "vs_float32_eager", "matmul_ms", "attention_ms",
                     "other_ms", "framework_ms")


def shown(table, columns: Sequence[str]):
    """``table`` with those of ``columns`` that some row filled, in that order."""
    return table[[c for c in columns if c in table and table[c].notna().any()]]


# --- beside the ladder: a float32 eager run and llama.cpp, never in the ladder's own ratios ------

GOAL_FRACTION_OF_LLAMACPP = 1.0  # the best batch-1 rung should decode at least as fast as llama.cpp


def decode_sample_count(row) -> Optional[float]:
    """How many decode samples a rung's (or a reference's) p10-p90 range stands on: the per-token
    samples pooled over every round and repeat (``decode_samples``, or the length of
    ``decode_samples_ms``), else its timing summary's ``iterations``, else what
    ``decide.samples_of`` finds. The row's ``rounds`` is not that count: a round-robin rung's
    figures pool ``rounds x repeats`` generates of several decode steps each."""
    row = dict(row) if row is not None else {}
    count = row.get("decode_samples")
    if _known(count) and not isinstance(count, bool) and float(count) > 0:
        return float(count)
    samples = row.get("decode_samples_ms")
    if isinstance(samples, (list, tuple)) and samples:
        return float(len(samples))
    timing = row.get("timing")
    if isinstance(timing, Timing):
        timing = timing.summary()
    if isinstance(timing, dict) and _known(timing.get("iterations")) and timing["iterations"] > 0:
        return float(timing["iterations"])
    return decide.samples_of(row, None)


def decode_ratio(row, reference) -> Optional[dict]:
    """Decode speed of ``row`` over ``reference`` (above 1: the row decodes faster), from their
    ms per token, with the spread of both p10-p90 ranges; None when either lacks a decode figure."""
    try:
        ms, ref = float(row["decode_ms_per_token"]), float(reference["decode_ms_per_token"])
        p10, p90 = float(row.get("decode_p10_ms", ms)), float(row.get("decode_p90_ms", ms))
        r10, r90 = float(reference.get("decode_p10_ms", ref)), float(reference.get("decode_p90_ms", ref))
    except (KeyError, TypeError, ValueError):
        return None
    if not all(v > 0 for v in (ms, ref, p10, p90, r10, r90)):
        return None
    # the fewer samples of the two sides (None when either does not say): what decide needs
    return {"ratio": ref / ms, "low": r10 / p90, "high": r90 / p10, "n_samples": _fewest_samples((row, reference))}


def _fewest_samples(rows) -> Optional[float]:
    """The fewest ``decode_sample_count`` of ``rows``; None when any of them does not say."""
    counts = [decode_sample_count(r) for r in rows]
    return None if any(c is None for c in counts) else min(counts)


def reference_columns(table, reference: Optional[dict], name: str):
    """``vs_<name>`` (with ``_low`` / ``_high``): each ok batch-1 rung's decode speed over the
    reference's. Rungs at another batch size get none: the reference decodes one sequence."""
    table = table.assign(**{f"vs_{name}{suffix}": None for suffix in ("", "_low", "_high")})
    if not reference:
        return table
    for i, row in _batch1(table).iterrows():
        found = decode_ratio(row, reference)
        if found:
            table.at[i, f"vs_{name}"], table.at[i, f"vs_{name}_low"], table.at[i, f"vs_{name}_high"] = (
                found["ratio"], found["low"], found["high"])
    return table


def goal_decision(ratio: Optional[dict], fraction: float = GOAL_FRACTION_OF_LLAMACPP) -> str:
    """A ratio to llama.cpp against the goal ``fraction``, in ``decide.met``'s words: ``met`` when the
    whole spread is at or above it, ``not met`` when it is all below, ``within the noise of the goal``
    when the spread straddles it, ``too_few`` from too few samples, ``not measured`` without a ratio.
    Recorded with the figure; the chapter's page says what was recorded."""
    if not ratio:
        return "not measured"
    return met(ratio["low"], ratio["high"], fraction, samples=ratio.get("n_samples"))


def rung_effect(table, rung_id: str) -> Optional[dict]:
    """The rung ``rung_id`` against the ok batch-1 rung before it: ``{"verdict": faster / slower /
    no_difference, "ratio", "low", "high", "previous"}`` from the decode spreads (None if either did
    not run)."""
    step = next((s for s in ladder_steps(table) if s["rung_id"] == rung_id), None)
    if step is None:
        return None
    verdict = direction(step["low"], step["high"], samples=step.get("n_samples"))
    step.pop("rung"), step.pop("rung_id")
    if decide.is_too_few(verdict):
        return {**step, "verdict": "too_few", "decision": verdict}
    return {**step, "verdict": "no_difference" if verdict == SAME else verdict}


# --- where a decode step's time goes ---------------------------------------------------------------

STEP_PARTS = ("matmul kernels", "attention", "other kernels", "framework and Python")
_STEP_PART_OF_KIND = {"weight matmul": "matmul kernels", "attention": "attention"}


def step_part(name: str) -> Optional[str]:
    """Which part of a decode step a profiler event's self time belongs to (None: not a kernel,
    i.e. Python, dispatch and compiled-graph wrappers, counted as the rest of the step).

    Matmul and attention kernels are named by ``profiling.kernel_kind`` (chapter 03's split), plus
    inductor's C++ GEMM template kernels, which max-autotune names ``graph_N_kernel``."""
    if name.startswith("graph_") and name.endswith("_kernel") and "cpp_fused" not in name:
        return "matmul kernels"
    part = _STEP_PART_OF_KIND.get(profiling.kernel_kind(name))
    if part:
        return part
    if "cpp_fused" in name or name.startswith(("aten::", "mkldnn::", "quantized::")):
        return "other kernels"
    return None


def decode_step_parts(model, tokenizer, prompts: Sequence[str], *, decode_ms: float, steps: int = 8,
                      static_cache: bool = False, cache_tokens: Optional[int] = None, device="cpu") -> dict:
    """ms per decode step in each of ``STEP_PARTS``, from ``torch.profiler``: greedy generations of
    ``steps + 1`` tokens and of 1 token through ``model.generate`` differ by ``steps`` decode steps
    (``profiling.decode_step_split``, CPU activity, each profiled run after a warm one).

    Each kernel part's share of the profiled step (self time over wall time) is applied to the
    rung's measured ``decode_ms``; ``framework and Python`` is the rest (Python, dispatch, graph
    wrappers and the profiler's own cost), so the parts add up to ``decode_ms``. The static cache is
    sized for ``cache_tokens`` (the measurement's), so a compiled forward builds no graph here.
    """
    inputs = chat_inputs(tokenizer, list(prompts), device, chat=False)
    cache, kwargs = (static_decode.static_generate_kwargs(model, inputs, max(cache_tokens or 0, steps + 1))
                     if static_cache else (None, {}))
    with torch.inference_mode():
        split = profiling.decode_step_split(lambda n: generate_tokens(model, tokenizer, inputs, n, **kwargs),
                                            steps + 1, device, part_of=step_part, device_kernels=False,
                                            warm=True, reset=cache.reset if cache is not None else None)
    wall = max(split["wall_ms"], 1e-9)
    shares = {k: max(split["ms"].get(k, 0.0), 0.0) / wall for k in STEP_PARTS[:3]}
    total = sum(shares.values())
    if total > 1:  # noise made the kernels longer than the step: keep their proportions
        shares = {k: v / total for k, v in shares.items()}
    shares["framework and Python"] = max(1.0 - sum(shares.values()), 0.0)
    return {**{k: v * decode_ms for k, v in shares.items()}, "decode_ms": decode_ms, "steps_profiled": steps,
            "profiled_step_ms": wall}


def what_stands_in_the_way(parts: dict, reference_ms: float,
                           fraction: float = GOAL_FRACTION_OF_LLAMACPP) -> dict:
    """Why a step misses ``fraction`` of a reference's speed: the target step is
    ``reference_ms / fraction``; ``"matmul kernels"`` when they alone exceed it (no cut of the rest
    reaches the goal), else ``"the rest of the step"`` (the kernels fit; attention, other kernels,
    Python and dispatch push the step over). ``over_ms`` is how far the step is above the target."""
    if not reference_ms > 0 or not 0 < fraction <= 1:
        raise ValueError(f"reference_ms={reference_ms!r} and fraction={fraction!r} must be > 0 (fraction <= 1)")
    target = reference_ms / fraction
    step = sum(parts.get(k, 0.0) for k in STEP_PARTS)
    matmul = parts.get("matmul kernels", 0.0)
    return {"target_ms": target, "step_ms": step, "over_ms": step - target, "matmul_ms": matmul,
            "blocker": "matmul kernels" if matmul > target else "the rest of the step"}


def int8_skip_reason(kernel_rows: list) -> Message:
    """Why the INT8 rung did not run: the kernel timings, dense against the fastest int8 kernel."""
    pick = pick_w8a16_kernel(kernel_rows)
    dense = next(r for r in kernel_rows if r["kernel"].startswith("dense"))
    best = next(r for r in kernel_rows if r["kernel"] == pick["kernel"])
    figures = dict(dense=dense["kernel"], best=best["kernel"], best_ms=best["decode_ms"],
                   best_low=best["decode_p10_ms"], best_high=best["decode_p90_ms"], dense_ms=dense["decode_ms"],
                   dense_low=dense["decode_p10_ms"], dense_high=dense["decode_p90_ms"])
    if pick["loses_to_dense"]:
        return message("the {dense} linears were faster than every int8 kernel beyond the spread at this model's "
                       "shapes (fastest {best} {best_ms:.2f} ms, p10-p90 {best_low:.2f}-{best_high:.2f}, against "
                       "{dense_ms:.2f} ms, p10-p90 {dense_low:.2f}-{dense_high:.2f}, per decode step), so INT8 would "
                       "make this rung slower", **figures)
    return message("the {dense} linears were not slower than the fastest int8 kernel beyond the spread at this "
                   "model's shapes (fastest {best} {best_ms:.2f} ms, p10-p90 {best_low:.2f}-{best_high:.2f}, against "
                   "{dense_ms:.2f} ms, p10-p90 {dense_low:.2f}-{dense_high:.2f}, per decode step), so INT8 could not "
                   "be shown to make it faster", **figures)


def int8_kernel_saving(kernel_rows: Optional[list]) -> Optional[dict]:
    """From ``quant.time_w8a16_kernels`` rows: the dense and the fastest int8 step, the saving (ms)."""
    usable = [r for r in kernel_rows or [] if not r.get("problem")]
    dense = next((r for r in usable if r["kernel"].startswith("dense")), None)
    usable = [r for r in usable if not r["kernel"].startswith("dense")]
    if dense is None or not usable:
        return None
    best = min(usable, key=lambda r: r["decode_ms"])
    return {"dense": dense["kernel"], "dense_ms": dense["decode_ms"], "kernel": best["kernel"],
            "kernel_ms": best["decode_ms"], "saving_ms": dense["decode_ms"] - best["decode_ms"]}


def weight_format_check(before, after, tokenizer, tokens: int = 128) -> dict:
    """Top-1 agreement and perplexity of ``after`` against ``before`` on held-out text (eager forwards):
    what a rung that changes the weights' format (INT4) costs in quality, measured where it runs."""
    ids = encode(tokenizer, load_heldout_text(), tokens).to(next(before.parameters()).device)
    ref = evaluate(before, ids, return_logits=True)
    out = evaluate(after, ids, ref["logits"])
    return {"tokens": int(ids.shape[1]), "top1_agreement": out["top1_agreement"],
            "perplexity_before": ref["perplexity"], "perplexity_after": out["perplexity"]}


def model_gguf(model: str):
    """The GGUF file ``model`` was converted from (the embedded one, or ``local_gguf``), else None."""
    return locate_embedded_gguf() if model == EMBEDDED_MODEL else local_gguf(model)


def output_format(gguf) -> str:
    """The GGUF type of the matrix llama.cpp computes the logits with (``output.weight``, or the tied
    ``token_embd.weight``), e.g. ``Q8_0`` or ``Q4_0``."""
    import gguf as gguf_lib

    types = {t.name: t.tensor_type.name for t in gguf_lib.GGUFReader(str(gguf)).tensors}
    return types.get("output.weight") or types["token_embd.weight"]


def llamacpp_reference(enabled: bool, device, model: str, prompt_ids, new_tokens: int, repeats: int) -> dict:
    """llama.cpp's figures for the ladder's request, or ``{"status": ..., "reason"}`` saying why not."""
    if not enabled:
        reason = message("the llamacpp parameter is off")
    elif (kind := as_device(device).type) != "cpu":
        reason = message("llama.cpp is the CPU reference; this ladder ran on {device}", device=kind)
    elif model_gguf(model) is None:
        reason = message("llama.cpp runs the embedded GGUF ({embedded}) or a local .gguf file; this ladder ran "
                         "{model}", embedded=EMBEDDED_MODEL, model=model)
    else:  # the very file the ladder's weights were converted from
        return llamacpp.measure(model_gguf(model), prompt_ids, new_tokens, repeats=repeats)
    return {"status": "skipped", "reason": reason}


class References:
    """llama.cpp and a float32 eager run, timed between the ladder's rounds (``run_ladder``'s
    ``between_rounds``), so the ratios to them come from the same stretch of machine state as the
    rungs'. ``llama()`` and ``fp32()`` pool the rounds (``llamacpp.pool``, ``measure.pooled``); a
    reference that does not run here is asked once and says why (``llamacpp_reference``).

    ``fp32_model`` is None when the working dtype is float32 (the first rung is float32 eager) or
    the reference is off. With ``rounds=0`` call ``measure_once()`` after the ladder instead.
    """

    def __init__(self, measure, *, llamacpp_on: bool, device, model: str, prompt_ids, new_tokens: int,
                 repeats: int, fp32_model=None, bandwidth_gbps: Optional[float] = None):
        self.measure, self.fp32_model, self.bandwidth = measure, fp32_model, bandwidth_gbps
        self.args = (llamacpp_on, device, model, prompt_ids, new_tokens, repeats)
        self.new_tokens, self.prompt_tokens = new_tokens, len(prompt_ids)
        self.llama_runs, self.fp32_runs = [], []

    def __call__(self, round_index: int = 0) -> None:
        if not self.llama_runs or self.llama_runs[-1].get("status") == "ok":
            self.llama_runs.append(llamacpp_reference(*self.args))
        if self.fp32_model is not None:
            self.fp32_runs.append(self.measure.again(Variant(self.fp32_model), warm=bool(self.fp32_runs)))

    measure_once = __call__

    def llama(self) -> dict:
        out = llamacpp.pool(self.llama_runs)
        if out.get("status") == "ok":  # its bytes per step beside the rungs', at the same mean context
            gguf = out["gguf_path"]  # the file that was timed, not always the embedded one
            out.update(llamacpp.bytes_per_step(gguf, self.prompt_tokens + self.new_tokens // 2))
            out.update(roofline_share(out["bytes_per_step"], out["decode_ms_per_token"], self.bandwidth))
        return out

    def fp32(self) -> Optional[dict]:
        if self.fp32_model is None or not self.fp32_runs:
            return None
        out = pool_runs(self.fp32_runs, len(self.fp32_runs))
        out["code_path"] = out.get("code_path", "") + ", float32 eager, timed between the ladder's rounds"
        return out


def reference_facts(table, llama: dict, fp32: Optional[dict],
                    fraction: float = GOAL_FRACTION_OF_LLAMACPP, int8_kernels: Optional[list] = None) -> dict:
    """Everything the references paragraph states, each decided by a named function above.
    ``int8_kernels``: the INT8 rung's kernel timings, which explain an INT8 rung that is not faster."""
    ok = _batch1(table)
    best = ok.iloc[ok["tokens_per_s"].astype(float).values.argmax()] if len(ok) else None
    facts: dict = {"llama": llama, "fraction": fraction, "best": None, "fp32": None, "blocker": None,
                   "int8": rung_effect(table, "int8_weights"), "int8_kernels": int8_kernel_saving(int8_kernels)}
    if facts["int8"]:
        row = table[table["rung_id"] == "int8_weights"].iloc[0]
        facts["int8"]["spread_ms"] = float(row["decode_p90_ms"] - row["decode_p10_ms"])
        facts["int8"]["decode_ms"] = float(row["decode_ms_per_token"])
    if best is not None:
        ratio = decode_ratio(best, llama) if llama.get("status") == "ok" else None
        facts["best"] = {"rung": best["rung"], "tok_s": float(best["tokens_per_s"]),
                         "decode_ms": float(best["decode_ms_per_token"]), "ratio": ratio,
                         "decision": goal_decision(ratio, fraction), "bytes_per_step": best.get("bytes_per_step"),
                         "roofline_share": best.get("roofline_share"), "dtype": best.get("dtype")}
        parts = {k: best.get(f"{k.split()[0]}_ms") for k in STEP_PARTS}
        if ratio and facts["best"]["decision"] != "met" and all(_known(v) for v in parts.values()):
            found = what_stands_in_the_way(parts, float(llama["decode_ms_per_token"]), fraction)
            if found["over_ms"] > 0:  # a step already within the target is held back by the spread, no part
                facts["blocker"] = {**found, "parts": parts, "instead": llamacpp.KERNELS[found["blocker"]]}
    if fp32 and best is not None:
        first = table[table["status"] == "ok"].iloc[0]
        facts["fp32"] = {"tok_s": 1e3 / float(fp32["decode_ms_per_token"]),
                         "native": decode_ratio(first, fp32), "best": decode_ratio(best, fp32),
                         "native_rung": first["rung"], "dtype": first.get("dtype")}
    return facts


def record_reference_figures(results, facts: dict, llama: dict, fp32: Optional[dict], device: str,
                             dtype: str, new_tokens: int) -> None:
    """What the references paragraph of chapter 06's template states, each a recorded figure:
    llama.cpp's decode and TTFT (or why it was not measured), the highest batch-1 rung's ratio to it
    with what stands in its way, the float32 eager run, and the INT8 rung's own step."""
    shape = message("batch {batch}, {prompt}-token prompt, {new} new tokens", batch=1,
                    prompt=llama.get("prompt_tokens", "?"), new=new_tokens)
    if llama.get("status") == "ok":
        ctx = dict(device=device, dtype=f"{llama['quantization']} weights (GGUF)", shape=shape,
                   code_path=llama["code_path"])
        results.record("llamacpp_decode_tok_s", llama["tokens_per_s"], "tok/s", key_figure=True,
                       decode_ms=llama["decode_ms_per_token"], p10_ms=llama["decode_p10_ms"],
                       p90_ms=llama["decode_p90_ms"], note=llama.get("note", ""), version=llama.get("version"),
                       quantization=llama["quantization"], threads=llama.get("threads"),
                       prompt_tokens=llama.get("prompt_tokens"), new_tokens=llama.get("new_tokens"),
                       system_info=llama.get("system_info", ""), **ctx)
        results.record("llamacpp_ttft_ms", llama["ttft_ms"], "ms", p10=llama["ttft_p10_ms"],
                       p90=llama["ttft_p90_ms"], **ctx)
        if _known(llama.get("roofline_share")):
            results.record("llamacpp_roofline_share", llama["roofline_share"], "fraction",
                           bytes_per_step=llama["bytes_per_step"], achieved_gbps=llama["achieved_gbps"],
                           **{**ctx, "code_path": "llamacpp.bytes_per_step (the GGUF's tensors in their own "
                              "formats + float16 KV cache at the mean context) x decode steps/s, over the "
                              "measured read bandwidth"})
    else:
        results.record("llamacpp_decode_tok_s", None, "tok/s", device=device, status=llama.get("status"),
                       reason=llama.get("reason", "") or llama.get("error", ""))
    best = facts.get("best")
    if best and best["ratio"]:
        blocker = facts.get("blocker") or {}
        parts = {f"{k.split()[0]}_ms": v for k, v in (blocker.get("parts") or {}).items()}
        results.record("ladder_best_batch1_vs_llamacpp", best["ratio"]["ratio"], "x", key_figure=True,
                       device=device, dtype=dtype, shape=shape, rung=best["rung"], low=best["ratio"]["low"],
                       high=best["ratio"]["high"], decision=best["decision"], goal=facts["fraction"],
                       tok_s=best["tok_s"], code_path=message("decode tok/s of the batch-1 rung with the highest "
                                                              "median over llama.cpp's, same run (not part of the "
                                                              "ladder's own ratios)"),
                       blocker=blocker.get("blocker"), step_ms=blocker.get("step_ms"),
                       target_ms=blocker.get("target_ms"), instead=blocker.get("instead"),
                       weights=best.get("dtype"), roofline_share=best.get("roofline_share"),
                       n_samples=best["ratio"].get("n_samples"), **parts)
    if fp32:
        results.record("float32_eager_decode_tok_s", 1e3 / float(fp32["decode_ms_per_token"]), "tok/s",
                       device=device, dtype="float32", shape=shape,
                       code_path=fp32.get("code_path") or "native eager protocol in float32")
        f = facts.get("fp32") or {}
        for key, which in (("native", "float32_vs_native_rung"), ("best", "float32_vs_best_rung")):
            if f.get(key):
                results.record(which, f[key]["ratio"], "x", low=f[key]["low"], high=f[key]["high"],
                               device=device, dtype=f.get("dtype") or dtype, shape=shape,
                               rung=f["native_rung"] if key == "native" else (best or {}).get("rung"),
                               code_path="decode tok/s of the rung over float32 eager's, same run")
    if facts.get("int8"):
        i, k = facts["int8"], facts.get("int8_kernels") or {}
        results.record("int8_rung_step", i["ratio"], "x", low=i["low"], high=i["high"], previous=i["previous"],
                       n_samples=i.get("n_samples"),  # the pooled decode samples: what the page's direction needs
                       decode_ms=i.get("decode_ms"), spread_ms=i.get("spread_ms"), device=device, dtype=dtype,
                       shape=shape, kernel=k.get("kernel"), kernel_ms=k.get("kernel_ms"), dense=k.get("dense"),
                       dense_ms=k.get("dense_ms"), saving_ms=k.get("saving_ms"),
                       code_path="decode tok/s of + INT8 over the rung before it; kernels timed alone at "
                                 "this model's shapes (quant.choose_cpu_w8a16_kernel)")


# --- building blocks for chapter 06's rungs ------------------------------------------------------

@dataclass
class Variant:
    """What a rung measures: a model, the batch of prompts (None: the ladder's), the cache kind,
    whether ``generate`` is replaced by the hand-written greedy loop (``decode_loop.GreedyLoop``), and
    the label of its weights when they are not the working dtype (``weights``: e.g. "int4 g32 weights,
    float16 activations"; None: the model's parameter dtype)."""
    model: Any
    prompts: Optional[Sequence[str]] = None
    static_cache: bool = False
    greedy_loop: bool = False
    weights: Optional[str] = None


# A ladder row's keys from measure_generation's, in the table's column order (the first two and the
# two filled by generation_measure itself are placeholders here).
_ROW_KEYS = ("latency_ms", "tokens_per_s", "peak_memory_bytes", "batch_size", "ttft_ms",
             "decode_ms_per_token", "decode_p10_ms", "decode_p90_ms", "ttft_p10_ms", "ttft_p90_ms",
             "dtype", "code_path", "greedy_loop", "prompt_tokens", "new_tokens", "weight_bytes",
             "compiled_graphs", "compile_s")
_TIMING_KEYS = ("latency_ms", "tokens_per_s", "ttft_ms", "decode_ms_per_token", "decode_p10_ms", "decode_p90_ms",
                "ttft_p10_ms", "ttft_p90_ms", "timing", "decode_samples", "bytes_per_step", "achieved_gbps",
                "roofline_tok_s", "roofline_share")


def roofline_share(bytes_per_step: Optional[float], decode_ms: Optional[float],
                   bandwidth_gbps: Optional[float]) -> dict:
    """``achieved_gbps`` (the bytes a decode step reads, per second of decode) and ``roofline_share``
    (achieved over the measured read bandwidth: 1.0 is the machine's limit); None where a figure is
    missing. The same count for every rung and for llama.cpp, so the two stand against one limit."""
    if not (_known(bytes_per_step) and _known(decode_ms) and decode_ms > 0):
        return {"achieved_gbps": None, "roofline_share": None}
    achieved = float(bytes_per_step) / (float(decode_ms) / 1e3) / 1e9
    return {"achieved_gbps": achieved,
            "roofline_share": achieved / bandwidth_gbps if bandwidth_gbps else None}


class GenerationMeasure:
    """The ``measure`` of ``run_ladder``, built on ``helpers.generation.measure_generation``.

    A variant is a ``Variant``, a model, or ``(model, prompts)`` for a rung that changes the batch.
    ``latency_ms`` is one full ``generate`` of ``max_new_tokens``; ``tokens_per_s`` is the aggregate
    over the batch; ``bytes_per_step`` is what one decode step of that variant reads
    (``generation.decode_bytes_per_step``, chapter 03's count: its weights plus the batch's KV cache
    at the mean context of the decode), so an INT8 rung reads its own, fewer bytes; the roofline is
    ``batch x bandwidth / bytes per step`` and ``roofline_share`` the achieved GB/s over the
    measured bandwidth (``roofline_share``). A compiled forward (``helpers.static_decode``) adds
    ``compiled_graphs`` and ``compile_s``. With ``profile_steps``, a batch-1 rung also gets the ms
    per step in each of ``STEP_PARTS`` (``decode_step_parts``), profiled on the same shapes after
    the timed runs.

    Calling it measures a variant once (``repeats`` timed generates after a warm-up). With rounds,
    ``run_ladder`` calls ``warm(variant)`` first (the warm-up, the compile and the profile, one timed
    generate: the figures come from the rounds), then ``again(variant)`` once per round (the variant
    is warm: no warm-up generate, only an untimed prefill), then ``pooled(variant, outs, row)``: the
    row's timing figures from those rounds' samples pooled (the profiled parts keep their shares of
    the step, scaled to the pooled step).
    """

    def __init__(self, tokenizer, prompts: Sequence[str], max_new_tokens: int, device, *,
                 bandwidth_gbps: Optional[float] = None, repeats: int = 3, profile_steps: int = 0):
        self.tokenizer, self.prompts, self.max_new_tokens, self.device = tokenizer, list(prompts), max_new_tokens, device
        self.bandwidth_gbps, self.repeats, self.profile_steps = bandwidth_gbps, repeats, profile_steps

    @staticmethod
    def _variant(variant) -> Variant:
        if not isinstance(variant, Variant):
            variant = Variant(*variant) if isinstance(variant, tuple) else Variant(variant)
        if not variant.greedy_loop:
            decode_loop.restore_generate(variant.model)
        elif decode_loop.greedy_loop_of(variant.model) is None:
            decode_loop.use_greedy_loop(variant.model)
        return variant

    def _generate(self, variant: Variant, repeats: int, warm: bool = False) -> dict:
        out = measure_generation(variant.model, self.tokenizer, list(variant.prompts or self.prompts),
                                 self.max_new_tokens, self.device, repeats=repeats,
                                 static_cache=variant.static_cache, warm=warm)
        if variant.greedy_loop:  # same protocol; the tokens come from the loop, not from generate
            out["code_path"] = out["code_path"].replace(
                "transformers generate", "hand-written greedy loop (helpers.decode_loop.GreedyLoop)", 1)
        return out

    def again(self, variant, warm: bool = True) -> dict:
        """One more timed ``measure_generation`` of a variant (a round of ``run_ladder``); ``warm``: it
        has run before (no warm-up generate; ``False`` for a variant's first run)."""
        return self._generate(self._variant(variant), self.repeats, warm=warm)

    def _row(self, variant: Variant, out: dict) -> dict:
        model = variant.model
        row = {k: out.get(k) for k in _ROW_KEYS}
        row.update(latency_ms=out["total_ms"], tokens_per_s=out["tokens_per_s_aggregate"],
                   greedy_loop=variant.greedy_loop, weight_bytes=weight_bytes(model),
                   dtype=variant.weights or out.get("dtype"))
        if out.get("decode_resolved"):  # run_ladder's speedup and spread: decode time per token
            row["timing"] = Timing("decode per token", [x / 1e3 for x in out["decode_samples_ms"]],
                                   device=str(self.device))
        row["decode_samples"] = len(out.get("decode_samples_ms") or ())
        sequences = out.get("batch_size") or len(variant.prompts or self.prompts)
        row["bytes_per_step"] = decode_bytes_per_step(model, sequences, out["prompt_tokens"] + self.max_new_tokens // 2)
        row.update(roofline_share(row["bytes_per_step"], out.get("decode_ms_per_token"), self.bandwidth_gbps))
        if self.bandwidth_gbps:
            row["roofline_tok_s"] = sequences * self.bandwidth_gbps * 1e9 / row["bytes_per_step"]
        return row

    def _measured(self, variant, repeats: int) -> dict:
        variant = self._variant(variant)
        out = self._generate(variant, repeats)
        row = self._row(variant, out)
        if self.profile_steps and row["batch_size"] == 1 and out.get("decode_resolved"):
            parts = decode_step_parts(variant.model, self.tokenizer, list(variant.prompts or self.prompts),
                                      decode_ms=out["decode_ms_per_token"],
                                      steps=min(self.profile_steps, self.max_new_tokens - 1),
                                      static_cache=variant.static_cache, cache_tokens=self.max_new_tokens,
                                      device=self.device)
            row.update({f"{k.split()[0]}_ms": parts[k] for k in STEP_PARTS})
        return row

    def __call__(self, variant) -> dict:
        return self._measured(variant, self.repeats)

    def warm(self, variant) -> dict:
        """The first measurement of a variant whose figures will come from the rounds: its warm-up
        (and compile), one timed generate and the profile of its step."""
        return self._measured(variant, 1)

    def pooled(self, variant, outs: list, row: dict) -> dict:
        if not outs:
            raise ValueError("outs is empty; give the rounds' measure_generation results")
        variant = self._variant(variant)
        out = pool_runs(outs, len(outs))
        out["total_ms"] = float(sorted(o["total_ms"] for o in outs)[len(outs) // 2])
        new = {k: v for k, v in self._row(variant, out).items() if k in _TIMING_KEYS}
        new["code_path"] = out["code_path"]
        new["compiled_graphs"] = (row.get("compiled_graphs") or 0) + sum(o.get("compiled_graphs") or 0 for o in outs) \
            if row.get("compiled_graphs") is not None else None
        before, after = row.get("decode_ms_per_token"), out.get("decode_ms_per_token")
        if _known(before) and _known(after) and before > 0:  # the profiled shares, on the pooled step
            for k in STEP_PARTS:
                key = f"{k.split()[0]}_ms"
                if _known(row.get(key)):
                    new[key] = row[key] * after / before
        return new


def generation_measure(tokenizer, prompts: Sequence[str], max_new_tokens: int, device, *,
                       bandwidth_gbps: Optional[float] = None, repeats: int = 3,
                       profile_steps: int = 0) -> GenerationMeasure:
    """``GenerationMeasure(...)``: the ``measure`` chapter 06 gives ``run_ladder``."""
    return GenerationMeasure(tokenizer, prompts, max_new_tokens, device, bandwidth_gbps=bandwidth_gbps,
                             repeats=repeats, profile_steps=profile_steps)


def apply_runtime_options(device, *, jit_compile: bool = False, allow_internal_format: bool = False) -> list[dict]:
    """The guide's 3.1 "CANN optimisation" switches: the real ones applied, the invented one exposed.

    Raises ``RungSkipped`` off an NPU (the options live in torch_npu). ``enable_auto_mixed_precision``
    is assigned exactly as the guide does, then shown to have been silently dropped: the assignment
    raises nothing and stores nothing, because torch_npu's config only knows allow_internal_format.
    """
    kind = getattr(getattr(device, "device", device), "type", None) or str(device).split(":")[0]
    if kind != "npu":
        raise RungSkipped(message("runtime options exist only in torch_npu; this run is on {device}", device=kind))
    npu = torch.npu
    npu.set_compile_mode(jit_compile=jit_compile)
    npu.config.allow_internal_format = allow_internal_format
    before = dict(vars(npu.config))
    npu.config.enable_auto_mixed_precision = True  # the guide's line, kept to show what it does
    stored = vars(npu.config) != before or "enable_auto_mixed_precision" in vars(npu.config)
    return [{"option": f"torch.npu.set_compile_mode(jit_compile={jit_compile})", "status": "applied",
             "note": "False uses the prebuilt binary kernels instead of compiling operators online"},
            {"option": f"torch.npu.config.allow_internal_format = {allow_internal_format}",
             "status": "applied", "note": "set-only; already off by default on 910B/A2"},
            {"option": "torch.npu.config.enable_auto_mixed_precision = True",
             "status": "stored (unexpected)" if stored else "silently ignored",
             "note": "no such option: the assignment raised nothing and changed nothing; mixed precision "
                     "is torch.autocast('npu', dtype=torch.float16) or loading in float16"}]


# --- the guide's table (4.2 MindSpeed-LLM框架应用) ----------------------------------------------

def guide_ladder():
    """The guide's ladder with ratios to its own first row (labelled as the guide's claim)."""
    import pandas as pd

    table = pd.DataFrame(claims.GUIDE_LADDER)
    base = table.iloc[0]
    table["speedup"] = base["latency_ms"] / table["latency_ms"]
    table["throughput_ratio"] = table["tokens_per_s"] / base["tokens_per_s"]
    table["memory_ratio"] = table["memory_gb"] / base["memory_gb"]
    table["source"] = message("guide's claim (910B, Llama-2-7B fp16)")
    return table


def compare_with_guide(ours, label: str = N_("measured here")):
    """Both ladders as ratios to their own baselines, long format (source, label, speedup, memory_ratio).

    ``label`` is English (plot fonts often lack CJK glyphs); the guide's Chinese rung names stay in
    ``guide_ladder()``.
    """
    import pandas as pd

    guide = guide_ladder()[["label", "speedup", "memory_ratio", "source"]]
    ours = ours.copy()
    if "batch_size" in ours and ours["batch_size"].notna().any():
        # The guide's ladder is batch-1 latency: a rung serving more users stays out of this comparison.
        base_batch = _ok_rows(ours)[1]
        ours = ours[ours["batch_size"].isna() | (ours["batch_size"] == (base_batch or 1))]
    ok = ours["status"] == "ok"
    base_mem = ours.loc[ok, "peak_memory_bytes"].iloc[0] if ok.any() else None
    ours["memory_ratio"] = ours["peak_memory_bytes"] / base_mem if base_mem else None
    ours["source"] = label
    ours["label"] = [r if s == "ok" else message("{rung} ({status})", rung=Message(r), status=Message(s))
                     for r, s in zip(ours["rung"], ours["status"])]
    return pd.concat([guide, ours[["label", "speedup", "memory_ratio", "source"]]], ignore_index=True)


BESIDE_THE_GUIDE = message("Batch-1 optimisation ladder: the guide's claim vs this run")


def beside_the_guide(ours, label: str = N_("measured here")) -> list[dict]:
    """The guide's ladder and ours as two panels of ``plots.plot_ladder`` (``compare_with_guide``'s
    speedups over each ladder's own baseline; a failed or skipped rung of ours has no bar)::

        plots.plot_ladder(ladder.beside_the_guide(table), ladder.BESIDE_THE_GUIDE)
    """
    data = compare_with_guide(ours, label)
    colours = dict(zip(data["source"].unique(), ("#999999", "#1f77b4")))
    return [{"title": source, "colour": colours[source], "ylabel": message("batch-1 speedup over own baseline (x)"),
             "rungs": [(name, None if not _known(value) else float(value))
                       for name, value in zip(group["label"], group["speedup"])]}
            for source, group in data.groupby("source", sort=False)]


# --- chapter 06: the best gain of the ladder and its spread ---------------------------------------

@dataclass
class Gain:
    """The option with the highest median, and what may be said of it against a baseline.

    ``decision`` is ``best, clear`` (its spread lies above the baseline's and apart from every other
    option's), ``best, tied`` (above the baseline's, but overlapping the options in ``tied``: none of
    them is the best) or ``no gain beyond the noise`` (its spread overlaps the baseline's).
    """

    best: str
    decision: str
    tied: list


def best_gain(options: Iterable[tuple[str, float, float, float]],
              baseline: tuple[str, float, float, float], *, samples: Optional[float] = None) -> Optional[Gain]:
    """``options`` and ``baseline`` are (name, median, p10, p90) of one figure where higher is better
    (chapter 06: each rung's decode tokens/s, the baseline native eager's); None when no option has a
    finite median. Two options are told apart only when their p10-p90 ranges do not overlap, the same
    test as a speedup spread wholly above 1 (``bench.speedup``); a figure without a finite spread is
    never called best, since its noise is unknown; from fewer than ``decide.MIN_SAMPLES``
    ``samples`` per rung the decision is ``decide.too_few``."""
    rows = [(n, m, lo, hi) for n, m, lo, hi in options if decide.finite(m)]
    found = decide.rank(rows, samples=samples)
    if found is None:
        return None
    if found.too_few:
        return Gain(found.best, found.too_few, [])
    _, _, low, high = next(r for r in rows if r[0] == found.best)
    others = [n for n in found.tied if n != found.best]
    _, _, base_low, base_high = baseline
    noise = not decide.finite(low, high, base_low, base_high) \
        or decide.spreads_overlap((low, high), (base_low, base_high)) or min(low, high) < min(base_low, base_high)
    return Gain(found.best, "no gain beyond the noise" if noise else "best, clear" if not others else "best, tied",
                others)


# --- chapter 06's worked answers (solutions/06): the facts each answer's paragraph is said from ----
# The paragraphs are blocks of templates/06_optimization_ladder.answers.md.j2 (``prose.answer``).

def compile_payoff_facts(table, new_tokens: int) -> dict:
    """Exercise 1: what compiling the graph rung cost (seconds, graphs, requests' worth at its
    latency) and what each request saves against the rung before it, with that rung's decode step
    ratio (``ladder_steps``: its spread and samples decide whether the graph rung decodes faster);
    ``ran`` False (with the rung's recorded error) when the graph rung did not run after another."""
    ok = table[table["status"] == "ok"].reset_index(drop=True)
    found = ok.index[ok["rung_id"] == "graph_mode"]
    if not len(found) or found[0] == 0:
        error = table.loc[table["rung_id"] == "graph_mode", "error"] if "error" in table else []
        return {"ran": False, "reason": error.iloc[0] if len(error) and error.iloc[0] else ""}
    graph, before = ok.loc[found[0]], ok.loc[found[0] - 1]
    step = next((s for s in ladder_steps(table) if s["rung_id"] == "graph_mode"), None)
    saved = before["latency_ms"] - graph["latency_ms"]
    return {"ran": True, "compile_s": graph["compile_s"], "graphs": graph["compiled_graphs"],
            "latency_ms": graph["latency_ms"], "new_tokens": new_tokens,
            "requests_worth": 1e3 * graph["compile_s"] / graph["latency_ms"], "before": before["rung"],
            "saved_ms": saved, "payoff_requests": 1e3 * graph["compile_s"] / saved if saved > 0 else None,
            "step": {key: step[key] for key in ("ratio", "low", "high", "n_samples")} if step else None}


def fusion_order_facts(rows, chapter_step: Optional[dict], dtype: str) -> dict:
    """Exercise 2: fusion's decode step ratio on the 16-bit model and after INT8, and both changes
    together in each order (rows with order, rung, step_ratio, low, high, n_samples), beside the
    chapter's own fused-operators step (``ladder_steps``' row, or None)."""
    def pick(order, rung):
        r = next(r for r in rows if r["order"] == order and r["rung"] == rung)
        return {"ratio": r["step_ratio"], "low": r["low"], "high": r["high"], "n_samples": r["n_samples"]}

    return {"dtype": dtype, "first": pick("fused then int8", "+ fused"), "after": pick("int8 then fused", "+ fused"),
            "total_a": pick("fused then int8", "both"), "total_b": pick("int8 then fused", "both"),
            "chapter": {key: chapter_step[key] for key in ("ratio", "low", "high", "previous", "n_samples")
                        if key in chapter_step} if chapter_step else None}


def roofline_rank_facts(table) -> dict:
    """Exercise 3: each ok batch-1 rung's share of its roofline with the spread of its decode step
    (the share is the step's inverse) and the samples pooled over its rounds; ``top`` the highest
    median and how much faster its bytes would allow it to decode."""
    ok = _batch1(table)
    rows = [{"rung": r["rung"], "pct": r["roofline_pct"],
             "low": r["roofline_pct"] * r["decode_ms_per_token"] / r["decode_p90_ms"],
             "high": r["roofline_pct"] * r["decode_ms_per_token"] / r["decode_p10_ms"],
             "tok_s": r["tokens_per_s"], "n_samples": decode_sample_count(r)}
            for _, r in ok.iterrows() if _known(r.get("roofline_pct"))]
    if not rows:
        return {"rungs": []}
    top = max(rows, key=lambda r: r["pct"])
    return {"rungs": rows, "top": {**top, "times": 100 / top["pct"]}}
