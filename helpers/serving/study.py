"""Chapter 07's own study (layer: chapter studies; taught in 07_serving): what the chapter
measures (``launch``), the sweep, our own path beside vLLM, users served, the tables, the plot
and what the chapter records.

4. **The sweep** (``Launch.sweep``, ``measure_sweep``): each level of ``(concurrency, prompt
   tokens, new tokens)`` measured with the client for at least ``min_requests`` steady-state
   requests (``requests_for``; the first wave and the drain are sent too, then left out and counted),
   ``repeats`` times; a request-rate level (``Launch.rate_level``: Poisson arrivals); and
   ``vllm bench serve`` once beside it (``Launch.bench_serve``).
5. **Our own path beside it** (``our_path_points``, ``no_ratio_reason``, ``ratio_spread``: a ratio
   and its spread, whose direction ``helpers.decide`` reads) and **users within targets**
   (``users_served``, ``search_users``): the largest concurrency at which at least ``GOOD_SHARE`` of
   the requests are good (succeeded, TTFT and TPOT both within the targets), counted from the bottom
   so a lower failing level stops the count, and found to one user by bisection for vLLM.
6. **What the chapter records** (``record_launch``, ``connect``, ``record_sweep``, ``record_bench``,
   ``record_comparison``, ``record_users``): figures and tables of ``results.json``, from which the
   chapter's template (``templates/07_serving.<lang>.md.j2``) writes every sentence; no function
   here builds a sentence about a measurement.

The top of ``helpers.serving``: imports ``server`` and ``client``, neither imports it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from .. import backend, params, plots, progress
from ..prose import PHRASES, Message, N_, message, recorded, recorded_rows, tell, tr
from ..results import device_class, load_results
from .client import (GOOD_SHARE, BenchNotRun, PromptSource, as_dict, bench_plan, bench_row,
                     bench_serve_command, is_good, poisson_arrivals, run_bench_serve, run_level,
                     served_model_id, steady_state, summarize)
from .server import (ServingUnavailable, VllmInstall, VllmServer, base_url, check_endpoint,
                     check_tensor_parallel, compile_cache_present, device_count, find_vllm,
                     model_for_server, start_server)

# The words of this chapter's tables (column names, categories in cells): ``prose.show`` translates
# them on the page through the runtime catalog; the recorded tables keep the English.
TABLE_WORDS = (
    N_("caveat"), N_("concurrency"), N_("tpot_ms"), N_("tpot_p10_ms"), N_("tpot_p90_ms"),
    N_("decode_tok_s_per_user"), N_("decode_tok_s_aggregate"), N_("requests"), N_("counted"),
    N_("warmup_excluded"), N_("drain_excluded"), N_("good_fraction"), N_("output_tok_s"), N_("ttft_p50_ms"),
    N_("ttft_p50_lo_ms"), N_("ttft_p95_ms"), N_("tpot_p50_ms"), N_("tpot_p50_lo_ms"), N_("tpot_p50_hi_ms"),
    N_("tpot_p95_ms"), N_("itl_p50_ms"), N_("itl_p50_lo_ms"), N_("itl_p50_hi_ms"), N_("itl_p95_ms"),
    N_("request_rate"), N_("sent_rate"), N_("mean_in_flight"), N_("our client"), N_("bench / client"),
    N_("definitions"), N_("ours_ttft_ms"), N_("vllm_ttft_ms"), N_("ours_tpot_ms"), N_("vllm_tpot_ms"),
    N_("ours_decode_tok_s_aggregate"), N_("vllm_decode_tok_s_aggregate"), N_("vllm_over_ours_ttft"),
    N_("vllm_over_ours_decode"), N_("no_ratio"), N_("engine"), N_("lengths"), N_("rule"), N_("levels"),
    N_("probes"), N_("users_served"), N_("upper"), N_("at_least"), N_("shown"), N_("resolution"),
    N_("limit"), N_("from"), N_("to"), N_("throughput_gain"), N_("ttft_p50_ms_gain"), N_("ttft_p95_ms_gain"),
    N_("good_fraction_at_to"), N_("judged"), N_("within TTFT target"), N_("needed"),
    N_("smallest TPOT target ms"), N_("limited by"),
)


# --- what the chapter measures: its parameters, a server started here or an endpoint --------------

def check_parameters(ch) -> list[int]:
    """The rules that relate a chapter's parameters (``open_chapter`` checks each one alone):
    ``endpoint`` is an http(s) URL or empty, ``bench_concurrency`` one of the levels of
    ``concurrency``, ``tensor_parallel_size`` at most the devices found. Returns the sweep's levels,
    sorted, each once; raises naming the parameter."""
    p = ch.parameters
    check_endpoint(p.get("endpoint", ""))
    levels = sorted(set(p["concurrency"]))
    params.check_choice("bench_concurrency", p["bench_concurrency"], levels)
    check_tensor_parallel(p.get("tensor_parallel_size", 1), device_count(ch.device.type), ch.device.type)
    return levels


@dataclass
class Launch:
    """What the chapter measures: a server started here, or an endpoint, or nothing (``skip_reason``).

    ``connect`` fills in what the server answers to (``model_id``), its ``tokenizer`` and ``served``
    (model, dtype, device, tensor parallel size: what a ratio with our own path checks); then
    ``sweep`` and ``bench_serve`` measure it.
    """

    url: str = ""
    server: Optional[VllmServer] = None
    install: Optional[VllmInstall] = None   # also runs ``vllm bench serve``; None when there is no vLLM
    served_model: str = ""                  # the folder or hub id the server loads
    local: bool = True
    cache_warm: bool = False                # vLLM's compile cache existed before this start
    enforce_eager: bool = False             # started with --enforce-eager: nothing compiled
    skip_reason: str = ""
    notes: list = field(default_factory=list)
    device_kind: str = "cpu"
    endpoint: str = ""                      # a server someone else runs, when one was given
    tensor_parallel_size: int = 1
    no_bench_reason: str = ""               # why ``vllm bench serve`` cannot run beside an endpoint
    model_id: str = ""
    tokenizer: Any = None
    prompts: Optional[PromptSource] = None  # every request of the run gets a prompt never sent before
    served: dict = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return not self.skip_reason

    def sweep(self, specs: Sequence[tuple], min_requests: int, request_timeout_s: float, *,
              targets: tuple, repeats: int = 1):
        """``measure_sweep`` against this server: (levels, requests) DataFrames."""
        return measure_sweep(self.url, self.model_id, self.prompts, specs, min_requests=min_requests,
                             targets=targets, repeats=repeats, request_timeout_s=request_timeout_s,
                             served=self.served)

    def rate_level(self, rate: float, requests: int, input_len: int, output_len: int, *, targets: tuple,
                   request_timeout_s: float, seed: int = 0):
        """``measure_rate`` against this server: (the level's row, its requests as a DataFrame)."""
        import pandas as pd

        row, results = measure_rate(self.url, self.model_id, self.prompts, rate=rate, requests=requests,
                                    input_len=input_len, output_len=output_len, targets=targets,
                                    request_timeout_s=request_timeout_s, seed=seed)
        return {**row, **self.served}, pd.DataFrame([{"request_rate": rate, **as_dict(r)} for r in results])

    def find_users(self, input_len: int, output_len: int, levels, *, min_requests: int, targets: tuple,
                   limit: int, request_timeout_s: float):
        """``search_users`` at these lengths from the levels already measured there (a DataFrame with
        ``concurrency`` and ``meets_targets``), measuring each concurrency the search asks for:
        (the search's result, the levels it measured as a DataFrame)."""
        import pandas as pd

        probes = []

        def meets(concurrency: int) -> bool:
            row, _ = self.sweep([(concurrency, input_len, output_len)], min_requests, request_timeout_s,
                                targets=targets)
            probes.append(row.iloc[0].to_dict())
            return bool(row.iloc[0]["meets_targets"])

        rows = levels.to_dict(orient="records") if hasattr(levels, "to_dict") else list(levels)
        known = {int(r["concurrency"]): bool(r["meets_targets"]) for r in rows
                 if int(r.get("input_len", input_len)) == input_len
                 and int(r.get("output_len", output_len)) == output_len}
        found = search_users(meets, known, limit)
        by = {int(r["concurrency"]): r for r in rows + probes}
        failing = by.get(found["first_failing"])
        found["limit"] = _missed(failing) if failing is not None else ""
        return found, pd.DataFrame(probes)

    def bench_serve(self, folder: "str | Path", *, input_len: int, output_len: int, concurrency: int,
                    num_prompts: int, timeout_s: float) -> Optional[dict]:
        """``vllm bench serve`` once against this server, its JSON and log kept in ``folder``; the
        result in the sweep's column names (``bench_row``), or None when this vLLM cannot run it
        (``no_bench_reason`` says why)."""
        folder = Path(folder)
        plan = bench_plan(self.install.python)
        try:
            command = bench_serve_command(self.install.python, self.url, self.model_id, self.served_model,
                                          input_len=input_len, output_len=output_len, concurrency=concurrency,
                                          num_prompts=num_prompts, result_dir=folder, result_file=BENCH_FILE,
                                          plan=plan)
            result = run_bench_serve(command, folder / BENCH_FILE, folder / BENCH_LOG, timeout_s)
        except BenchNotRun as exc:  # an older vLLM line: recorded as not run, with why
            self.no_bench_reason = str(exc)
            return None
        return bench_row(result, input_len, output_len, plan)


BENCH_FILE, BENCH_LOG = "vllm_bench_serve.json", "vllm_bench_serve.log"


def launch(device_kind: str, model: str, dtype: str, folder: "str | Path", *, endpoint: str = "",
           port: int = 8000, max_model_len: int = 1024, tensor_parallel_size: int = 1,
           kv_cache_gib: float = 0.0, enforce_eager: bool = False) -> Launch:
    """Start vLLM for ``model`` in ``dtype`` (without waiting for it), or take ``endpoint``; a missing
    vLLM or a model vLLM cannot load gives a ``Launch`` with ``skip_reason`` instead of an error.
    ``enforce_eager`` starts the server without its torch.compile warm-up (``server_command``)."""
    out = Launch(device_kind=device_kind, endpoint=endpoint, tensor_parallel_size=tensor_parallel_size)
    try:
        out.served_model, out.local = model_for_server(model)
        try:
            out.install = find_vllm(device_kind)
        except ServingUnavailable as exc:
            if not endpoint:
                raise
            out.no_bench_reason = str(exc)
            out.notes.append(f"vllm bench serve is not run: {exc}")
    except ServingUnavailable as exc:
        out.skip_reason = str(exc)
        return out
    if endpoint:
        out.url = base_url(endpoint)
        return out
    out.cache_warm, out.enforce_eager = compile_cache_present(), enforce_eager
    out.server, note = start_server(out.install, out.served_model, dtype, folder, port=port,
                                    max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
                                    kv_cache_gib=kv_cache_gib, model_is_local=out.local,
                                    enforce_eager=enforce_eager)
    out.url = out.server.url
    if note:
        out.notes.append(note)
    return out


# --- 4. the sweep (the client's levels, recorded as figures) --------------------------------------

def requests_for(concurrency: int, min_requests: int) -> int:
    """Requests a closed-loop level sends so that at least ``min_requests`` fall in its steady state:
    ``min_requests`` + the first wave (``concurrency``, when more than one) + the drain (at most
    ``concurrency - 1``: ``client.steady_state``)."""
    c = int(concurrency)
    return int(min_requests) + (c if c > 1 else 0) + (c - 1)


MEDIAN_SPREADS = ("ttft", "tpot", "itl")


def measure_level(url: str, model: str, prompts: PromptSource, *, concurrency: int, input_len: int,
                  output_len: int, min_requests: int, targets: tuple, repeats: int = 1, warmup: bool = True,
                  request_timeout_s: float = 60.0) -> tuple[dict, list]:
    """One level: an untimed warm-up round (``concurrency`` short requests), then ``repeats`` runs of
    ``requests_for(concurrency, min_requests)`` requests at ``concurrency`` in flight, every prompt
    fresh. The row pools the repeats' steady-state requests (``summarize``: the first wave and the
    drain of each run left out and counted, the good fraction against ``targets``) and, with more than
    one repeat, the spread of the runs' medians (``<ttft|tpot|itl>_p50_lo_ms`` / ``_hi_ms``: the
    lowest and highest). Returns the row and every request's result with its run and whether it was
    counted."""
    if warmup:
        run_level(url, model, prompts.take(concurrency, input_len), min(4, output_len), concurrency,
                  request_timeout_s=request_timeout_s, input_len=input_len)
    results, flags, runs, per_run, duration, warm, drain = [], [], [], [], 0.0, 0, 0
    for run in range(int(repeats)):
        batch, seconds = run_level(url, model, prompts.take(requests_for(concurrency, min_requests), input_len),
                                   output_len, concurrency, request_timeout_s=request_timeout_s,
                                   input_len=input_len)
        counted, w, d = steady_state(batch, concurrency)
        per_run.append(summarize(batch, seconds, concurrency, counted=counted, targets=targets))
        results += batch
        flags += counted
        runs += [run] * len(batch)
        duration, warm, drain = duration + seconds, warm + w, drain + d
    row = summarize(results, duration, concurrency, counted=flags, targets=targets)
    row.update(input_len=input_len, output_len=output_len, repeats=int(repeats), warmup_excluded=warm,
               drain_excluded=drain, ttft_target_ms=targets[0], tpot_target_ms=targets[1])
    for name in MEDIAN_SPREADS:
        medians = [one[f"{name}_median_ms"] for one in per_run if one[f"{name}_median_ms"] is not None]
        spread = (min(medians), max(medians)) if len(medians) > 1 else (None, None)
        row[f"{name}_p50_lo_ms"], row[f"{name}_p50_hi_ms"] = spread
    return row, [(r, {"run": run, "counted": c, "good": is_good(r, *targets) and c})
                 for r, c, run in zip(results, flags, runs)]


def measure_sweep(url: str, model: str, prompts: PromptSource, specs: Sequence[tuple], *, min_requests: int,
                  targets: tuple, repeats: int = 1, request_timeout_s: float = 60.0,
                  served: Optional[dict] = None):
    """Every ``(concurrency, input_len, output_len)`` of ``specs`` as ``measure_level``. Returns the
    levels (a DataFrame, one row per spec, ``served`` columns added: the model, dtype and device the
    server runs) and every request (a DataFrame: its level, run, whether it was counted and good)."""
    import pandas as pd

    levels, requests = [], []
    for concurrency, input_len, output_len in progress.steps(list(specs),
                                                             lambda s: message("concurrency {n}", n=s[0])):
        row, results = measure_level(url, model, prompts, concurrency=int(concurrency), input_len=int(input_len),
                                     output_len=int(output_len), min_requests=min_requests, targets=targets,
                                     repeats=repeats, request_timeout_s=request_timeout_s)
        levels.append({**row, **(served or {})})
        requests += [{"concurrency": concurrency, "input_len": input_len, "output_len": output_len, **extra,
                      **as_dict(r)} for r, extra in results]
    return pd.DataFrame(levels), pd.DataFrame(requests)


def measure_rate(url: str, model: str, prompts: PromptSource, *, rate: float, requests: int, input_len: int,
                 output_len: int, targets: tuple, request_timeout_s: float = 60.0,
                 seed: int = 0) -> tuple[dict, list]:
    """A request-rate level: ``requests`` fresh prompts sent at Poisson arrival times of ``rate`` per
    second (``client.poisson_arrivals``), with no cap on how many are in flight (``vllm bench serve
    --request-rate`` without ``--max-concurrency``). Users arrive instead of waiting in a closed loop,
    so there is no first wave to leave out: every request is counted. The row adds the rate asked,
    the rate sent and the mean number in flight (the sum of the latencies over the level's time)."""
    arrivals = poisson_arrivals(requests, rate, seed=seed)
    results, duration = run_level(url, model, prompts.take(requests, input_len), output_len, max(1, int(requests)),
                                  request_timeout_s=request_timeout_s, input_len=input_len, arrivals=arrivals)
    row = summarize(results, duration, 1, counted=[True] * len(results), targets=targets)
    busy = sum(max(0.0, r.end_s - r.start_s) for r in results)
    row.update(concurrency=None, request_rate=float(rate),
               sent_rate=(len(results) - 1) / arrivals[-1] if len(results) > 1 and arrivals[-1] > 0 else None,
               mean_in_flight=busy / duration if duration > 0 else None, input_len=input_len,
               output_len=output_len, decode_tok_s_aggregate=None, ttft_target_ms=targets[0],
               tpot_target_ms=targets[1], repeats=1)
    return row, results


LEVEL_FIGURES = (("output_tok_s", "tok/s"), ("good_fraction", "share"), ("ttft_p50_ms", "ms"),
                 ("ttft_p95_ms", "ms"), ("ttft_p99_ms", "ms"), ("tpot_p50_ms", "ms"), ("tpot_p95_ms", "ms"),
                 ("tpot_p99_ms", "ms"), ("itl_p50_ms", "ms"), ("itl_p95_ms", "ms"))


def record_levels(ch, levels, prefix: str, key_figures: Sequence[str] = (), **context) -> None:
    """Each level's figures as ``<prefix>_<figure>_c<concurrency>`` with its lengths in the shape
    (``ch.record``: the chapter's device and dtype); ``key_figures`` names the figures
    (``"output_tok_s_c8"``...) that go on the index."""
    for row in levels.to_dict(orient="records"):
        c = int(row["concurrency"])
        shape = message("concurrency {concurrency}, prompt {prompt} tokens, {new} new tokens", concurrency=c,
                        prompt=row["input_len"], new=row["output_len"])
        for name, unit in LEVEL_FIGURES:
            if row.get(name) is not None:
                ch.record(f"{prefix}_{name}_c{c}", row[name], unit, key_figure=f"{name}_c{c}" in key_figures,
                          shape=shape, requests=row["requests"], failed=row["failed"],
                          counted=row.get("counted"), warmup_excluded=row.get("warmup_excluded"),
                          drain_excluded=row.get("drain_excluded"), **context)


# Where the two measure the same thing and where not, for the side-by-side table.
DEFINITIONS = {
    "ttft": N_("same: request sent -> first streamed chunk with a choice (HTTP, queueing, prefill, detokenising)"),
    "tpot": N_("same: (latency - TTFT) / (output tokens - 1), output tokens from the server's usage"),
    "itl": N_("same: gaps between streamed chunks; a chunk may carry several tokens"),
    "e2el": N_("same: request sent -> last chunk with a choice"),
    "output_tok_s": N_("same formula (output tokens / wall time of the timed requests); prompts differ: "
                       "vLLM's random token ids vs slices of the held-out text, and its warm-up is full length"),
}


# --- 5. our own path beside it, and users served ---------------------------------------------------

_SHAPE = re.compile(r"prompt (\d+) tokens, (\d+) new tokens")


def lengths_from_shape(shape: str) -> tuple[Optional[int], Optional[int]]:
    """``"batch 1, prompt 5 tokens, 50 new tokens"`` -> (5, 50); (None, None) when not stated."""
    m = _SHAPE.search(str(shape or ""))
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _int(value) -> Optional[int]:
    value = _num(value)
    return int(value) if value is not None else None


def _num(value) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value == value else None


def contention(results: dict) -> str:
    """The CPU-contention note a chapter recorded (``backend.cpu_contention``), or ''."""
    return next((n for n in results.get("notes", []) if str(n).startswith("CPU load average")), "")


def _word(value: Any) -> Any:
    """A recorded rung name as a message: the one its record kept, else (an older record) the word."""
    return value if isinstance(value, Message) else Message(str(value))


def our_path_points(run_dir: "str | Path") -> tuple[list[dict], list[str]]:
    """Chapter 03's batch-1 figures, chapter 04's batch sweep and chapter 06's best batch-1 rung and
    batch rung, read from the run's results (never re-measured), one row per concurrency point.

    Each row: source, chapter, concurrency (= batch), prompt_tokens, new_tokens, model, dtype,
    device, ttft_ms / ttft_p90_ms, tpot_ms (decode ms per token) / tpot_p90_ms, decode tok/s per
    user and aggregate, code_path, and ``caveat``: the chapter's note when it measured under CPU
    contention. The second value lists what could not be read, and why.
    """
    rows, missing = [], []

    def state(chapter):
        data = load_results(run_dir, chapter)
        if data is None:
            missing.append(f"{chapter} did not run in this run folder")
        elif data.get("status") != "ok":
            missing.append(f"{chapter} is {data.get('status')}: its figures are not compared")
            data = None
        return data

    ch03 = state("03_end_to_end")
    if ch03:
        m = ch03.get("metrics", {})
        ttft, dec = m.get("ttft_ms"), m.get("decode_tok_s_batch1")
        if ttft and dec:
            prompt, new = lengths_from_shape(dec.get("shape"))
            rows.append({"source": message("03 batch-1 eager generate"), "chapter": "03_end_to_end", "concurrency": 1,
                         "prompt_tokens": prompt, "new_tokens": new, "caveat": contention(ch03),
                         "model": ch03["parameters"].get("model"), "dtype": recorded(dec, "dtype"),
                         "device": dec.get("device"), "ttft_ms": _num(ttft["value"]),
                         "ttft_p10_ms": _num(ttft.get("low")), "ttft_p90_ms": _num(ttft.get("high")), "tpot_ms": _num(dec.get("decode_ms_per_token")),
                         "tpot_p10_ms": _num(dec.get("decode_p10_ms")), "tpot_p90_ms": _num(dec.get("decode_p90_ms")),
                         "decode_tok_s_per_user": _num(dec["value"]),
                         "decode_tok_s_aggregate": _num(dec["value"]), "code_path": recorded(dec, "code_path")})
        else:
            missing.append("03_end_to_end recorded no ttft_ms / decode_tok_s_batch1")
    ch04 = state("04_batching")
    if ch04:
        for r in recorded_rows(ch04, "batch_sweep") or []:
            if r.get("status") != "ok" or not r.get("decode_resolved", True):
                continue
            rows.append({"source": message("04 batch sweep, batch {batch}", batch=r["point"]), "chapter": "04_batching",
                         "concurrency": int(r["point"]), "prompt_tokens": _int(r.get("prompt_tokens")),
                         "new_tokens": _int(r.get("new_tokens")), "caveat": contention(ch04),
                         "model": ch04["parameters"].get("model"),
                         "dtype": r.get("dtype"), "device": r.get("device"), "ttft_ms": _num(r.get("ttft_ms")),
                         "ttft_p10_ms": _num(r.get("ttft_p10_ms")), "ttft_p90_ms": _num(r.get("ttft_p90_ms")), "tpot_ms": _num(r.get("decode_ms_per_token")),
                         "tpot_p10_ms": _num(r.get("decode_p10_ms")), "tpot_p90_ms": _num(r.get("decode_p90_ms")),
                         "decode_tok_s_per_user": _num(r.get("tokens_per_s_per_user")),
                         "decode_tok_s_aggregate": _num(r.get("tokens_per_s_aggregate")),
                         "code_path": r.get("code_path")})
    ch06 = state("06_optimization_ladder")
    if ch06:
        ladder = {r.get("rung"): r for r in recorded_rows(ch06, "ladder") or [] if r.get("status") == "ok"}
        m = ch06.get("metrics", {})
        for key, label in (("ladder_best_batch1_speedup", N_("best batch-1 rung")),
                           ("ladder_batch_throughput_ratio", N_("batch rung"))):
            r = ladder.get((m.get(key) or {}).get("rung"))
            if r is None:
                missing.append(f"06_optimization_ladder recorded no {label}")
                continue
            batch = int(r.get("batch_size") or 1)
            per_user = 1e3 / r["decode_ms_per_token"] if _num(r.get("decode_ms_per_token")) else None
            rows.append({"source": message("06 {label}: {rung}", label=Message(label), rung=_word(r["rung"])), "chapter": "06_optimization_ladder",
                         "concurrency": batch, "prompt_tokens": _int(r.get("prompt_tokens")),
                         "new_tokens": _int(r.get("new_tokens") or ch06["parameters"].get("max_new_tokens")),
                         "caveat": contention(ch06),
                         "model": ch06["parameters"].get("model"), "dtype": r.get("dtype"),
                         "device": ch06.get("environment", {}).get("device"), "ttft_ms": _num(r.get("ttft_ms")),
                         "ttft_p10_ms": None, "ttft_p90_ms": None, "tpot_ms": _num(r.get("decode_ms_per_token")),
                         "tpot_p10_ms": _num(r.get("decode_p10_ms")), "tpot_p90_ms": _num(r.get("decode_p90_ms")),
                         "decode_tok_s_per_user": per_user,
                         "decode_tok_s_aggregate": per_user * batch if per_user else None,
                         "code_path": r.get("code_path") or r.get("description")})
    return rows, missing


def no_ratio_reason(ours: dict, served: dict) -> str:
    """Why our figure and vLLM's do not measure the same thing ('' when they do): same model, dtype,
    device class, prompt and output lengths, and concurrency = batch."""
    checks = (("model", ours.get("model"), served.get("model")),
              ("dtype", ours.get("dtype"), served.get("dtype")),
              ("device", device_class(ours.get("device")), device_class(served.get("device"))),
              ("prompt tokens", ours.get("prompt_tokens"), served.get("input_len")),
              ("new tokens", ours.get("new_tokens"), served.get("output_len")),
              ("concurrency", ours.get("concurrency"), served.get("concurrency")))
    for name, a, b in checks:
        if a in (None, "") or b in (None, ""):
            return message("{name} not recorded", name=Message(name))  # the names are the tables' words
        if (_num(a) != _num(b)) if _num(a) is not None and _num(b) is not None else str(a) != str(b):
            return message("{name} differs ({ours} vs {theirs})", name=Message(name), ours=a, theirs=b)
    return ""


def ratio_spread(numerator: tuple, denominator: tuple) -> tuple[Optional[float], Optional[float]]:
    """The conservative spread of ``numerator / denominator``, each a (median, p10, p90) of a
    time: p10 / p90 to p90 / p10 (``bench.speedup``'s rule); (None, None) when a side has no
    recorded spread, so that no direction is read from a ratio without one."""
    (_, lo1, hi1), (_, lo2, hi2) = numerator, denominator
    if any(_num(v) is None or _num(v) <= 0 for v in (lo1, hi1, lo2, hi2)):
        return None, None
    return lo1 / hi2, hi1 / lo2


def users_served(levels: Sequence[dict], key: str = "meets_targets") -> dict:
    """The guide's "concurrent dialogs per card" as a method, on the levels measured: counting up from
    the lowest concurrency, the largest one before the first level that misses the targets (a level
    meets them when ``key`` is true: ``summarize``'s ``meets_targets``, at least ``GOOD_SHARE`` of its
    requests good, failures counted as not good). A lower failing level stops the count, whatever the
    levels above it did.

    Returns ``users`` (0 when the lowest level misses), ``first_failing`` (the concurrency that
    missed, None when none did), ``at_least`` (True when the largest level measured still met them:
    more users might fit), ``levels`` (the concurrencies measured) and ``limit`` (what the first
    failing level missed).
    """
    measured = sorted((lv for lv in levels if lv.get(key) is not None), key=lambda lv: int(lv["concurrency"]))
    users, failing, limit = 0, None, ""
    for lv in measured:
        if not lv[key]:
            failing, limit = int(lv["concurrency"]), _missed(lv)
            break
        users = int(lv["concurrency"])
    return {"users": users, "first_failing": failing, "at_least": bool(measured) and failing is None and users > 0,
            "levels": [int(lv["concurrency"]) for lv in measured], "limit": limit}


def _missed(lv: dict) -> str:
    """What a level that missed the targets missed, in figures."""
    parts = []
    if _num(lv.get("good_fraction")) is not None:
        parts.append(message("{pct:.0f} % of {judged} requests good", pct=100 * lv["good_fraction"],
                             judged=lv.get("judged")))
    if lv.get("failed"):
        parts.append(message("{failed} failed", failed=lv["failed"]))
    for name, key, target in (("TTFT", "ttft_p90_ms", lv.get("ttft_target_ms")),
                              ("TPOT", "tpot_p90_ms", lv.get("tpot_target_ms"))):
        if _num(lv.get(key)) is not None and _num(target) is not None and lv[key] > target:
            parts.append(f"p90 {name} {lv[key]:.0f} ms > {target:g} ms")
    return message("at concurrency {concurrency}: {missed}", concurrency=lv["concurrency"], missed=parts)


def search_users(meets, known: dict, limit: int) -> dict:
    """The largest concurrency that meets the targets, to one user: from the levels already measured
    (``known``: concurrency -> met), doubling past the largest while it still meets them (up to
    ``limit``), then bisecting between the last passing and the first failing concurrency, calling
    ``meets(concurrency)`` for every level it needs (each a new measurement). A lower failing level
    stops the count as in ``users_served``.

    Returns ``users``, ``first_failing`` (``users + 1`` once the search closed, None when ``limit``
    was reached still passing: then ``at_least``), ``probes`` (the concurrencies it measured, in
    order, with the outcome) and ``resolution`` (1 when closed)."""
    hi = next((c for c in sorted(known) if not known[c]), None)
    lo = max((c for c in known if known[c] and (hi is None or c < hi)), default=0)
    probes = []
    # doubling while no level has failed, then bisecting between the last passing and the first failing
    while (hi is None and lo and lo * 2 <= limit) or (hi is not None and hi - lo > 1):
        c = lo * 2 if hi is None else (lo + hi) // 2
        ok = bool(meets(c))
        probes.append((c, ok))
        lo, hi = (c, hi) if ok else (lo, c)
    closed = hi is not None
    return {"users": lo, "first_failing": hi, "at_least": not closed and lo > 0, "probes": probes,
            "resolution": 1 if closed else None, "levels": sorted(set(known) | {c for c, _ in probes})}


# Why there is no users-served ratio: decision keys, phrased in prose.PHRASES.
NO_USERS_RATIO_BASELINE = "users ratio: baseline serves none"
NO_USERS_RATIO_BOUND = "users ratio: lower bound"
NO_USERS_RATIO_MISSING = "users ratio: not both measured"


def users_served_ratio(engine: dict, baseline: dict) -> tuple[Optional[float], str]:
    """engine users / baseline users, or (None, why not, a decision key): a count bounded only by the
    sweep's end (``at_least``) or a zero baseline has no ratio."""
    if baseline["users"] == 0:
        return None, NO_USERS_RATIO_BASELINE
    if engine["at_least"] or baseline["at_least"]:
        return None, NO_USERS_RATIO_BOUND
    return engine["users"] / baseline["users"], ""


def ours_within(points: Sequence[dict], ttft_target_ms: float, tpot_target_ms: float) -> list[dict]:
    """Our path's batch points judged by the goodput rule as far as their records allow: every user of
    a batch gets the batch's TTFT and its TPOT, so a timed generate's requests are all good or all
    not; chapter 04 records the median and p90 of its generates (not each one), so a point meets the
    targets when its p90 TTFT and p90 TPOT do: at least 90 % of its generates within each target,
    the most its records vouch for (not ``GOOD_SHARE``)."""
    out = []
    for p in points:
        ttft, tpot = _num(p.get("ttft_p90_ms")), _num(p.get("tpot_p90_ms"))
        met = None if ttft is None or tpot is None else (ttft <= ttft_target_ms and tpot <= tpot_target_ms)
        out.append({**p, "meets_targets": met, "ttft_target_ms": ttft_target_ms, "tpot_target_ms": tpot_target_ms})
    return out


def matched_specs(points: Sequence[dict]) -> list[tuple]:
    """The ``(concurrency, input_len, output_len)`` of every point of our path whose lengths are known,
    once each: vLLM is measured at exactly these, so a ratio compares the same work."""
    specs = [(int(p["concurrency"]), int(p["prompt_tokens"]), int(p["new_tokens"])) for p in points
             if p.get("prompt_tokens") and p.get("new_tokens")]
    return list(dict.fromkeys(specs))


COMPARISON_COLUMNS = ["source", "chapter", "concurrency", "prompt_tokens", "new_tokens", "model", "dtype",
                      "ours_ttft_ms", "vllm_ttft_ms", "vllm_ttft_p90_ms", "vllm_tpot_p90_ms", "ours_tpot_ms",
                      "vllm_tpot_ms", "ours_decode_tok_s_per_user", "vllm_decode_tok_s_per_user",
                      "ours_decode_tok_s_aggregate", "vllm_decode_tok_s_aggregate", "vllm_over_ours_ttft",
                      "vllm_over_ours_ttft_low", "vllm_over_ours_ttft_high", "vllm_over_ours_decode",
                      "vllm_over_ours_decode_low", "vllm_over_ours_decode_high", "no_ratio", "caveat"]
# What the chapter shows of it: the spreads and their directions are the comparison paragraph's.
COMPARISON_SHOWN = ["source", "concurrency", "prompt_tokens", "new_tokens", "dtype", "ours_ttft_ms",
                    "vllm_ttft_ms", "ours_tpot_ms", "vllm_tpot_ms", "ours_decode_tok_s_aggregate",
                    "vllm_decode_tok_s_aggregate", "vllm_over_ours_ttft", "vllm_over_ours_decode", "no_ratio"]


def comparison_table(points: Sequence[dict], matched) -> "Any":
    """Our path's points beside vLLM at the same concurrency and lengths: TTFT, decode per user and in
    aggregate, and the ratios vLLM / ours with their spreads (``ratio_spread`` of the two sides'
    p10-p90) where both measure the same thing; otherwise ``no_ratio`` says why."""
    import pandas as pd

    served = {(int(r["concurrency"]), int(r["input_len"]), int(r["output_len"])): r
              for r in (matched.to_dict(orient="records") if hasattr(matched, "to_dict") else matched)}
    rows = []
    for p in points:
        key = (int(p["concurrency"]), int(p.get("prompt_tokens") or 0), int(p.get("new_tokens") or 0))
        v = served.get(key) or {}
        reason = no_ratio_reason(p, v) if v else message("vLLM was not measured at these lengths")
        if not reason and not v.get("completed"):
            reason = message("every vLLM request failed: {errors}", errors=v.get("errors", ""))
        row = {name: None for name in COMPARISON_COLUMNS}
        row.update({"source": p["source"], "chapter": p["chapter"], "concurrency": p["concurrency"],
                    "prompt_tokens": p.get("prompt_tokens"), "new_tokens": p.get("new_tokens"),
                    "model": p.get("model"), "dtype": p.get("dtype"), "ours_ttft_ms": p.get("ttft_ms"),
                    "vllm_ttft_ms": v.get("ttft_median_ms"), "vllm_ttft_p90_ms": v.get("ttft_p90_ms"),
                    "vllm_tpot_p90_ms": v.get("tpot_p90_ms"), "ours_tpot_ms": p.get("tpot_ms"),
                    "vllm_tpot_ms": v.get("tpot_median_ms"),
                    "ours_decode_tok_s_per_user": p.get("decode_tok_s_per_user"),
                    "vllm_decode_tok_s_per_user": v.get("decode_tok_s_per_user"),
                    "ours_decode_tok_s_aggregate": p.get("decode_tok_s_aggregate"),
                    "vllm_decode_tok_s_aggregate": v.get("decode_tok_s_aggregate"),
                    "no_ratio": reason, "caveat": p.get("caveat", "")})
        if not reason and row["ours_ttft_ms"] and row["vllm_ttft_ms"]:
            row["vllm_over_ours_ttft"] = row["vllm_ttft_ms"] / row["ours_ttft_ms"]
            row["vllm_over_ours_ttft_low"], row["vllm_over_ours_ttft_high"] = ratio_spread(
                (v["ttft_median_ms"], v.get("ttft_p10_ms"), v.get("ttft_p90_ms")),
                (p["ttft_ms"], p.get("ttft_p10_ms"), p.get("ttft_p90_ms")))
        if not reason and row["ours_decode_tok_s_per_user"] and row["vllm_decode_tok_s_per_user"]:
            row["vllm_over_ours_decode"] = row["vllm_decode_tok_s_per_user"] / row["ours_decode_tok_s_per_user"]
            # decode speed vLLM / ours = time per token ours / vLLM
            row["vllm_over_ours_decode_low"], row["vllm_over_ours_decode_high"] = ratio_spread(
                (p["tpot_ms"], p.get("tpot_p10_ms"), p.get("tpot_p90_ms")),
                (v["tpot_median_ms"], v.get("tpot_p10_ms"), v.get("tpot_p90_ms")))
        rows.append(row)
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


USERS_COLUMNS = ["engine", "lengths", "rule", "levels", "probes", "users_served", "upper", "at_least", "shown",
                 "resolution", "limit"]


def users_row(engine: str, lengths: str, rule: str, found: dict, resolution: str) -> dict:
    """One row of the users-within-targets table from ``users_served`` or ``search_users``; ``upper``
    is the largest count the measured levels leave possible (first failing - 1), ``shown`` the count
    as the page writes it: "n", "n-m" (not resolved between two measured levels) or ">= n"."""
    users, failing = found["users"], found.get("first_failing")
    upper = failing - 1 if failing is not None else None
    shown = (f">= {users}" if found["at_least"] else str(users) if upper in (None, users) else f"{users}-{upper}")
    return {"engine": engine, "lengths": lengths, "rule": rule, "levels": found.get("levels", []),
            "probes": [c for c, _ in found.get("probes", [])], "users_served": users, "upper": upper,
            "at_least": found["at_least"], "shown": shown, "resolution": resolution,
            "limit": found.get("limit", "")}


def users_table(rows: Sequence[dict]):
    """The users-within-targets rows (``users_row``) as one DataFrame."""
    import pandas as pd

    return pd.DataFrame(list(rows), columns=USERS_COLUMNS)


VLLM_SWEEP = N_("vLLM, our client")
VLLM_AT_04 = N_("vLLM at chapter 04's lengths")
OURS_04 = N_("our path: chapter 04 batch sweep")


def lengths_of(rows: Sequence[dict]) -> str:
    """``"32 + 64"``: the prompt + new tokens of these levels or points, each pair once."""
    found = sorted({(r.get("input_len") or r.get("prompt_tokens"), r.get("output_len") or r.get("new_tokens"))
                    for r in rows})
    return ", ".join(f"{a} + {b}" for a, b in found)


def goodput_rule(ttft_target_ms: float, tpot_target_ms: float) -> str:
    return message("at least {pct:.0f} % of requests succeeded with TTFT <= {ttft:g} ms and TPOT <= {tpot:g} ms",
                   pct=100 * GOOD_SHARE, ttft=ttft_target_ms, tpot=tpot_target_ms)


def users_of_ours(points: Sequence[dict], ttft_target_ms: float, tpot_target_ms: float) -> Optional[dict]:
    """Our path's users-within-targets row from chapter 04's batch points (``ours_within``), at the
    resolution of its batch sizes; None without points."""
    ours = [p for p in ours_within(points, ttft_target_ms, tpot_target_ms) if p["chapter"] == "04_batching"]
    if not ours:
        return None
    return users_row(OURS_04, lengths_of(ours),
                     message("p90 TTFT <= {ttft:g} ms and p90 TPOT <= {tpot:g} ms per batch size (chapter 04 records "
                             "no single generate)", ttft=ttft_target_ms, tpot=tpot_target_ms), users_served(ours),
                     message("chapter 04's batch sizes"))


def users_within_targets(launch: "Launch", sweep, matched, points: Sequence[dict], *, min_requests: int,
                         targets: tuple, limit: int, request_timeout_s: float):
    """Users within targets for both paths: vLLM searched to one user (``Launch.find_users``) at the
    sweep's lengths (from the sweep's levels) and at chapter 04's lengths (from vLLM's levels matched
    to chapter 04's batch sizes), and our path at chapter 04's batch sizes (``users_of_ours``).
    Returns the table (``users_table``) and every level the searches measured (a DataFrame)."""
    import pandas as pd

    rows, probes, searches = [], [], []
    rule = goodput_rule(*targets)
    if len(sweep):
        first = sweep.to_dict(orient="records")[0]
        searches.append((VLLM_SWEEP, int(first["input_len"]), int(first["output_len"]), sweep))
    ours04 = [p for p in points if p["chapter"] == "04_batching" and p.get("prompt_tokens") and p.get("new_tokens")]
    if ours04 and len(matched):
        a, b = int(ours04[0]["prompt_tokens"]), int(ours04[0]["new_tokens"])
        batches = {int(p["concurrency"]) for p in ours04}
        at04 = matched[(matched["input_len"] == a) & (matched["output_len"] == b)
                       & matched["concurrency"].isin(batches)]
        if len(at04):
            searches.append((VLLM_AT_04, a, b, at04))
    for engine, a, b, levels in searches:
        found, measured = launch.find_users(a, b, levels, min_requests=min_requests, targets=targets,
                                            limit=limit, request_timeout_s=request_timeout_s)
        if len(measured):
            probes.append(measured.assign(search=engine))
        rows.append(users_row(engine, f"{a} + {b}", rule, found, message("1 user (bisection)") if found["resolution"]
                              else message("searched up to concurrency {limit}", limit=limit)))
    ours = users_of_ours(points, *targets)
    if ours:
        rows.append(ours)
    return users_table(rows), (pd.concat(probes, ignore_index=True) if probes else pd.DataFrame())


def users_ratio(users) -> tuple[Optional[float], str]:
    """vLLM's users within targets over our path's at chapter 04's lengths, the figure the guide's
    15 -> 42 is set beside; (None, why: a decision key) when there is none."""
    rows = {r["engine"]: {"users": r["users_served"], "at_least": r["at_least"]}
            for r in (users.to_dict(orient="records") if len(users) else [])}
    if any(e not in rows for e in (VLLM_AT_04, OURS_04)):
        return None, NO_USERS_RATIO_MISSING
    return users_served_ratio(rows[VLLM_AT_04], rows[OURS_04])


def figure_name(label: str) -> str:
    """``"vLLM, our client"`` -> ``"vllm_our_client"``: a label as part of a figure's key."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def bench_vs_client(client: dict, bench: dict):
    """Our client's level and ``vllm bench serve``'s run at the same concurrency and lengths, metric by
    metric, with where their definitions agree and where they differ (``DEFINITIONS``)."""
    import pandas as pd

    rows = []
    for metric in ("ttft_median_ms", "ttft_p99_ms", "tpot_median_ms", "tpot_p99_ms", "itl_median_ms",
                   "e2el_median_ms", "output_tok_s"):
        a, b = client.get(metric), bench.get(metric)
        rows.append({"metric": metric, "our client": a, "vllm bench serve": b,
                     "bench / client": (b / a) if a and b else None,
                     "definitions": DEFINITIONS[metric.split("_")[0] if metric != "output_tok_s" else metric]})
    return pd.DataFrame(rows)


def plot_serving(sweep, comparison, points: Sequence[dict], title: str, lang: str = "en"):
    """Two panels against concurrency: throughput (vLLM's output tok/s and decode aggregate, our
    path's decode aggregate per batch), and TTFT (vLLM's p50 and p95, our path's median and p90)."""
    import matplotlib.pyplot as plt

    lang = plots.chart_language(lang)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if len(sweep):
        left.plot(sweep["concurrency"], sweep["output_tok_s"], "o-", label=tell(lang, "vLLM output tok/s (sweep lengths)"))
        left.plot(sweep["concurrency"], sweep["decode_tok_s_aggregate"], "o--",
                  label=tell(lang, "vLLM decode aggregate (sweep lengths)"))
        right.plot(sweep["concurrency"], sweep["ttft_p50_ms"], "o-", label=tell(lang, "vLLM p50 (sweep lengths)"))
        right.plot(sweep["concurrency"], sweep["ttft_p95_ms"].astype(float), "o--",
                   label=tell(lang, "vLLM p95 (sweep lengths; none from under 20 requests)"))
    ours = [p for p in points if p["chapter"] == "04_batching"]
    if ours:
        batch = [p["concurrency"] for p in ours]
        left.plot(batch, [p["decode_tok_s_aggregate"] for p in ours], "s-", label=tell(lang, "our path: chapter 04 batch"))
        right.plot(batch, [p["ttft_ms"] for p in ours], "s-", label=tell(lang, "our path: chapter 04 median"))
        right.plot(batch, [p["ttft_p90_ms"] for p in ours], "s--", label=tell(lang, "our path: chapter 04 p90"))
        at04 = comparison[comparison["chapter"] == "04_batching"] if len(comparison) else comparison
        if len(at04):
            left.plot(at04["concurrency"], at04["vllm_decode_tok_s_aggregate"], "^:",
                      label=tell(lang, "vLLM decode aggregate at chapter 04's lengths"))
    xs = sorted({int(x) for line in left.get_lines() + right.get_lines() for x in line.get_xdata()})
    for ax, ylabel in ((left, "tokens/s"), (right, tell(lang, "TTFT (ms)"))):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_xlabel(tell(lang, "concurrency (our path: batch size)"))
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    left.set_title(tell(lang, "throughput"))
    right.set_title(tell(lang, "time to first token"))
    fig.suptitle(tr(title, lang))
    fig.tight_layout()
    return fig


# --- 6. what the chapter records (templates/07_serving.<lang>.md.j2 says it) ------------------------
# Each function takes the chapter (``helpers.chapter.open_chapter``): ``ch.record`` fills in the
# device and the dtype, ``ch.results`` keeps the tables, notes and files of the run folder.

def record_launch(ch, launch: Launch) -> None:
    """What the chapter measures (the server started here, an endpoint, or why nothing), and the
    tensor-parallel size against the devices found."""
    for note in launch.notes:
        ch.results.note(note)
    engine = f"{launch.install.distribution} {launch.install.version}" if launch.install else ""
    if launch.install is not None and launch.install.ascend:
        engine += " + vllm-ascend"
    ch.record("serving_launch", launch.url, code_path="serving.launch", engine=engine,
              python=launch.install.python if launch.install else "", endpoint=bool(launch.endpoint),
              served_model_local=launch.local, compile_cache_before_start=launch.cache_warm,
              enforce_eager=launch.enforce_eager, skip_reason=launch.skip_reason, notes=list(launch.notes),
              tensor_parallel_size=launch.tensor_parallel_size, devices_found=device_count(launch.device_kind))


def connect(ch, launch: Launch, start_timeout_s: float) -> None:
    """Wait until the server started here answers ``/health`` (``start_timeout_s``), then ask it which
    model it serves and load that model's tokenizer (the prompts are token ids). Records the start
    time with the command and the log, the model id, and the CPU load before the sweep (the server
    shares this machine's cores)."""
    # Here, not at the top: transformers takes seconds to import, and only a server that answers
    # needs a tokenizer (a skipped chapter never loads it).
    from transformers import AutoTokenizer

    if launch.server is not None:
        start_s = launch.server.wait_healthy(start_timeout_s)
        ch.results.artifact(launch.server.log_path, "vLLM server log")
        ch.record("vllm_server_start_s", start_s, "s", key_figure=True,
                  code_path=" ".join(launch.server.command[1:]), log=launch.server.log_path.name,
                  compile_cache_before_start=launch.cache_warm, enforce_eager=launch.enforce_eager,
                  server_pgid=launch.server.process.pid, port=launch.server.port)
    launch.model_id = served_model_id(launch.url)
    launch.tokenizer = AutoTokenizer.from_pretrained(launch.served_model)
    launch.prompts = PromptSource(launch.tokenizer, seed=int(ch.parameters.get("prompt_seed", 0)))
    dtype_known = not launch.endpoint or ch.parameters.get("dtype", "auto") != "auto"
    launch.served = {"model": ch.parameters.get("model"), "dtype": ch.DT if dtype_known else "",
                     "device": launch.device_kind, "tensor_parallel_size": launch.tensor_parallel_size}
    busy = backend.cpu_contention(ch.device)
    if busy:
        ch.results.note(busy)
    ch.record("served_model_id", launch.model_id, code_path=f"GET {launch.url}/v1/models",
              cpu_contention=busy or "")


def record_our_path(ch, points: Sequence[dict], missing: Sequence[str]):
    """Our path's points (``our_path_points``) as the table ``our_path``; what could not be read as
    notes and in the figure ``our_path_points``."""
    import pandas as pd

    for why in missing:
        ch.results.note(why)
    ours = pd.DataFrame(list(points))
    ch.results.table("our_path", ours)
    ch.record("our_path_points", len(points), "points", missing=list(missing),
              code_path="serving.our_path_points: chapters 03, 04 and 06 of this run, read back")
    return ours


SWEEP_COLUMNS = ["concurrency", "requests", "counted", "warmup_excluded", "drain_excluded", "failed",
                 "good_fraction", "output_tok_s", "ttft_p50_ms", "ttft_p50_lo_ms", "ttft_p50_hi_ms", "ttft_p90_ms",
                 "ttft_p95_ms", "tpot_p50_ms", "tpot_p50_lo_ms", "tpot_p50_hi_ms", "tpot_p90_ms", "tpot_p95_ms",
                 "itl_p50_ms", "itl_p50_lo_ms", "itl_p50_hi_ms", "itl_p95_ms"]
RATE_COLUMNS = ["request_rate", "sent_rate", "mean_in_flight", "requests", "failed", "good_fraction",
                "output_tok_s", "ttft_p50_ms", "ttft_p90_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p90_ms",
                "tpot_p95_ms", "itl_p50_ms", "itl_p95_ms"]


def record_sweep(ch, launch: Launch, sweep, requests) -> None:
    """The sweep's levels and requests as tables, each level's figures as ``serving_*_c<n>``
    (the largest level's throughput and concurrency 1's median TTFT on the index)."""
    ch.results.table("sweep", sweep)
    ch.results.table("sweep_requests", requests)
    top = int(sweep["concurrency"].max())
    record_levels(ch, sweep, "serving", key_figures=(f"output_tok_s_c{top}", "ttft_p50_ms_c1"),
                  code_path=f"OpenAI /v1/completions streamed, httpx, {launch.url}")
    p = ch.parameters
    ch.record("sweep_requests_per_level", int(sweep["counted"].min()), "requests",
              min_requests=p.get("min_requests"), repeats=p.get("repeats", 1),
              enough_for_p95=bool(sweep["enough_for_p95"].all()),
              warmup_excluded=int(sweep["warmup_excluded"].sum()), drain_excluded=int(sweep["drain_excluded"].sum()),
              prompts_sent=len(launch.prompts.seen) if launch.prompts else None,
              code_path="serving.measure_level: the fewest steady-state requests of a level, "
                        "first wave and drain excluded (client.steady_state)")


def record_rate(ch, launch: Launch, levels, requests) -> None:
    """The request-rate levels (table ``rate_levels`` and ``rate_requests``), each one's good fraction
    and latencies as ``rate_<figure>_r<rate>``."""
    ch.results.table("rate_levels", levels)
    ch.results.table("rate_requests", requests)
    for row in levels.to_dict(orient="records"):
        tag = f"{row['request_rate']:g}".replace(".", "_")
        shape = (f"Poisson arrivals at {row['request_rate']:g} requests/s, prompt {row['input_len']} tokens, "
                 f"{row['output_len']} new tokens")
        for name, unit in LEVEL_FIGURES:
            if row.get(name) is not None:
                ch.record(f"rate_{name}_r{tag}", row[name], unit, shape=shape, requests=row["requests"],
                          failed=row["failed"], code_path=f"serving.measure_rate, {launch.url}")


def record_bench(ch, launch: Launch, bench: Optional[dict], sweep):
    """``vllm bench serve``'s level as ``bench_serve_*_c<n>`` and beside our client's level of the same
    concurrency (table ``bench_vs_client``, returned); when it did not run, why (``bench_serve_ran``)."""
    import pandas as pd

    if bench is None:
        why = (launch.skip_reason or launch.no_bench_reason
               or ("bench_serve is off" if not ch.parameters.get("bench_serve", True) else "it did not run"))
        ch.record("bench_serve_ran", False, reason=why, code_path="vllm.benchmarks.serve")
        return pd.DataFrame()
    ch.results.artifact(ch.results.folder / BENCH_FILE, "vllm bench serve result")
    code_path = "vllm.benchmarks.serve add_cli_args + main, random dataset"
    record_levels(ch, pd.DataFrame([bench]), "bench_serve", code_path=code_path)
    if bench["failed"]:
        ch.results.note(f"vllm bench serve: {bench['failed']} of {bench['requests']} requests failed "
                        f"(its log, {BENCH_LOG}, says why)")
    level = sweep[sweep["concurrency"] == ch.parameters["bench_concurrency"]].iloc[0].to_dict()
    side = bench_vs_client(level, bench)
    ch.results.table("bench_vs_client", side)
    ch.record("bench_serve_ran", True, reason="", concurrency=bench["concurrency"],
              requests=bench["requests"], failed=bench["failed"], log=BENCH_LOG, code_path=code_path)
    return side


def record_comparison(ch, points: Sequence[dict], matched):
    """vLLM at our path's lengths (table ``matched``) beside our path (table ``comparison``,
    returned), and chapter 03's batch-1 point as figures where both did the same work: the decode
    and TTFT ratios, vLLM over our path, with their spreads; chapter 08's claims read the decode one."""
    ch.results.table("matched", matched)
    comparison = comparison_table(points, matched)
    ch.results.table("comparison", comparison)
    at03 = comparison[(comparison["no_ratio"] == "") & (comparison["chapter"] == "03_end_to_end")]
    for row in at03.to_dict(orient="records"):
        shape = message("batch {batch}, prompt {prompt} tokens, {new} new tokens", batch=1, prompt=row["prompt_tokens"],
                        new=row["new_tokens"])
        ch.record("engine_batch1_decode_ratio", row["vllm_over_ours_decode"], "x", key_figure=True,
                  shape=shape, low=row["vllm_over_ours_decode_low"], high=row["vllm_over_ours_decode_high"],
                  caveat=row["caveat"],
                  code_path=message("vLLM 1000 / median TPOT over chapter 03's (t(N) - t(1)) / (N - 1), same run"))
        ch.record("engine_batch1_ttft_ratio", row["vllm_over_ours_ttft"], "x", shape=shape,
                  low=row["vllm_over_ours_ttft_low"], high=row["vllm_over_ours_ttft_high"],
                  code_path="vLLM median TTFT over chapter 03's 1-token generate")
    return comparison


def record_users(ch, users) -> tuple[Optional[float], str]:
    """The users-within-targets table, each engine's count as a figure (with the upper end its
    measured levels leave open and the resolution), and vLLM over our path at chapter 04's lengths
    (``users_ratio``) when there is one, else why not (``users_served_no_ratio``, a decision key);
    returns ``(ratio, why)``."""
    ttft, tpot = ch.parameters["ttft_target_ms"], ch.parameters["tpot_target_ms"]
    ch.results.table("users_served", users)
    rows = {}
    for row in users.to_dict(orient="records"):
        rows[row["engine"]] = row
        ch.record("users_served_" + figure_name(row["engine"]), row["users_served"], "users",
                  shape=f"prompt + new tokens: {row['lengths']}", at_least=row["at_least"], upper=row["upper"],
                  shown=row["shown"], resolution=row["resolution"], probes=list(row["probes"]),
                  levels=list(row["levels"]), code_path=f"largest concurrency with {row['rule']}")
    ratio, why = users_ratio(users)
    if ratio is not None:
        ours = rows[OURS_04]
        low = (rows[VLLM_AT_04]["users_served"] / ours["upper"]) if ours["upper"] else None
        ch.record("users_served_ratio", ratio, "x", key_figure=True, low=low, high=ratio,
                  shape="chapter 04's batch sizes and lengths", guide="15 -> 42 (2.8x)",
                  code_path=f"users within TTFT <= {ttft:g} ms and TPOT <= {tpot:g} ms, vLLM (goodput, "
                            "bisected to one user) over our path (p90 at chapter 04's batch sizes)")
    else:
        # the decision's English sentence, which the claims audit quotes
        ch.results.not_recorded("users_served_ratio", PHRASES.get(why, why))
        ch.record("users_served_no_ratio", why, code_path="serving.users_ratio")
    return ratio, why
