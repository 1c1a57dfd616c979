"""dtype=auto, the working dtype of a run (layer: model and kernels; taught in 00_environment_check).

float16 on NPU/CUDA; on a CPU the model's real forward, built from its config with random weights,
timed in float32, bfloat16 and float16, and the dtype that serves a standard request fastest beyond
the spread picked (``choose_dtype``). Chapter 00 measures and records the choice; the later chapters
of a run read it back (``recorded_dtype_choice``). The probe times with ``bench`` and finds the
model's config through ``model_files`` before any weights are loaded, so it sits above both and
below ``models``, whose ``load_model(dtype="auto")`` comes here; ``backend`` keeps only the dtype
names (``backend.named_dtype``).
"""
from __future__ import annotations

import copy
import json
import math
import os
import statistics
from contextlib import suppress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

import torch

from . import model_files, progress, prose
from .backend import DTYPES, as_device, cpu_capability, dtype_name, return_freed_heap
from .backend import named_dtype
from .bench import Timing, assert_within, measure
from .prose import message
from .results import load_results
from .versions import cache_argument, cache_of

# The embedded SmolLM2-135M's widths (its config.json), used to build the probe model when no model
# is named and no config can be read without a download.
EMBEDDED_WIDTHS = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
                   "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
                   "num_hidden_layers": 30, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 8192}
CPU_CANDIDATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Bytes of float32 weights one probe model may hold: a larger model is built with the decoder layers
# that fit (at least one; the embedding, final norm and lm_head always whole) and its per-layer time
# scaled to all layers. The embedded model (about 540 MB in float32) fits whole.
PROBE_BYTES = 768 * 2**20
# Prefill is timed at two prompt lengths, so its time is a line in the prompt length; the decode step
# is timed after a KV cache of the longer one.
PROBE_PROMPT_TOKENS = (32, 128)
# The request dtype=auto picks for: its time is TTFT(prompt) + new tokens x one decode step.
REQUEST_PROMPT_TOKENS = 128
REQUEST_NEW_TOKENS = 64
FLIP_HORIZON_TOKENS = 8192  # the longest prompt for which a change of the pick is looked for
RUN_DIR_ENV = "WORKBOOK_RUN_DIR"  # set by the runner for every chapter of a run
DTYPE_CHOICE_KEY = "dtype_choice"  # chapter 00's recorded figure
DTYPE_DECISIONS = ("16bit_faster", "float32_not_slower", "no_16bit_usable")
# A challenger (a 16-bit dtype against float32, float16 against bfloat16) is picked only when it serves
# the request in at least this share less time than the incumbent, beyond both spreads as well. On a
# CPU where two dtypes come within a few tenths of each other (an AVX-512 BF16 CPU without AMX:
# bfloat16 2,684 ms against float16 2,967 in one run, float16 2,514 against bfloat16 2,955 minutes
# later), a pick by the spreads alone flipped from run to run and every later chapter with it.
PICK_MARGIN_PCT = 20
LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_shapes(config) -> dict:
    """``{kind: (out_features, in_features)}`` of one decoder layer of a Llama-style config, plus
    ``lm_head``, and ``layers``. ``config`` is a transformers config, a model or a dict of widths."""
    if hasattr(config, "config") and not isinstance(config, dict):
        config = config.config
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    try:
        hidden, inter = int(get("hidden_size")), int(get("intermediate_size"))
        heads = int(get("num_attention_heads"))
        kv = int(get("num_key_value_heads") or heads)
        head_dim = int(get("head_dim") or hidden // heads)
        vocab, layers = int(get("vocab_size")), int(get("num_hidden_layers"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config {config!r} lacks a Llama-style width ({exc}); give hidden_size, "
                         "intermediate_size, num_attention_heads, vocab_size and num_hidden_layers") from exc
    return {"q_proj": (heads * head_dim, hidden), "k_proj": (kv * head_dim, hidden),
            "v_proj": (kv * head_dim, hidden), "o_proj": (hidden, heads * head_dim),
            "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter),
            "lm_head": (vocab, hidden), "layers": layers}


def widths_of(model=None):
    """The widths to time for ``model`` without loading its weights: a config / model / dict as it
    is; ``tiny-random``'s config; a local folder's, a local GGUF's converted copy's or the embedded
    cache's ``config.json``; a hub id's config only if it is in the local cache (no download just to
    pick a dtype); else the embedded model's widths. Returns ``(widths, source)``."""
    if model is not None and not isinstance(model, str):
        return model, "the model's config"
    name = (model or "").strip()
    if name == model_files.TINY_MODEL:
        return model_files.tiny_llama()[0].config, "tiny-random's config"
    local = name and name != model_files.EMBEDDED_MODEL
    folder = Path(name).expanduser() if local else model_files.embedded_cache_path()
    if local and (gguf := model_files.local_gguf(name)) is not None:
        folder = model_files.ensure_gguf_cache(gguf)  # converted once; load_model reads the same folder
    with suppress(OSError, ValueError):
        return json.loads((folder / "config.json").read_text()), f"{folder.name}/config.json"
    if "/" in name and not folder.exists():
        with suppress(Exception):  # not cached: fall back, never download here
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(name, local_files_only=True), f"{name} (cached config)"
    return dict(EMBEDDED_WIDTHS), "the embedded SmolLM2-135M's widths"


def dtype_problem(dtype: torch.dtype) -> Optional[str]:
    """None when a small linear + RMSNorm in ``dtype`` runs here and matches float32; else why not."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 256, generator=gen)
    w = torch.randn(128, 256, generator=gen) / 16
    try:
        y = torch.nn.functional.linear(x.to(dtype), w.to(dtype))
        y = y * torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(dtype)
    except Exception as exc:  # noqa: BLE001  (an unimplemented kernel is an answer, not a crash)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    # the float32 reference from the same rounded inputs; the tolerance is the workbook's one rule
    ref = torch.nn.functional.linear(x.to(dtype).float(), w.to(dtype).float())
    ref = ref * torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + 1e-5)
    try:
        assert_within(y, ref, "ffn", what="a linear + RMSNorm")  # NaN fails too
    except AssertionError as exc:
        return str(exc).splitlines()[0][:300]
    return None


def probe_config(widths, layers: Optional[int] = None):
    """A transformers config for the probe model from ``widths_of``'s answer (a config, a model or a
    dict such as a ``config.json``), with ``layers`` decoder layers when given."""
    from transformers import AutoConfig, LlamaConfig

    if hasattr(widths, "config") and not isinstance(widths, dict):
        widths = widths.config
    if isinstance(widths, dict):
        values = dict(widths)
        kind = values.pop("model_type", None) or "llama"
        try:
            config = AutoConfig.for_model(kind, **values)
        except ValueError:  # a model type this transformers does not know: its widths as a Llama
            config = LlamaConfig(**values)
    else:
        config = copy.deepcopy(widths)
    if layers is not None:
        config.num_hidden_layers = layers
    config.use_cache = True
    return config


def probe_layers(widths, budget: int = PROBE_BYTES) -> tuple[int, int]:
    """``(layers built, layers of the model)``: the decoder layers whose float32 weights fit ``budget``
    beside the embedding, lm_head and final norm (always built whole), at least one."""
    shapes = linear_shapes(widths)
    hidden = shapes["o_proj"][0]
    per_layer = 4 * (sum(shapes[k][0] * shapes[k][1] for k in LAYER_LINEARS) + 2 * hidden)
    vocab_rows = shapes["lm_head"][0] * (1 if getattr(probe_config(widths), "tie_word_embeddings", False) else 2)
    fixed = 4 * (vocab_rows * hidden + hidden)
    fit = (budget - fixed) // max(per_layer, 1)
    return max(1, min(shapes["layers"], fit)), shapes["layers"]


class _ForwardProbe:
    """The real forward of a randomly initialised model built from the model's config, in one dtype.

    ``decode``: one batch-1 decode step (one token through the whole model, attention over a KV
    cache of the longer probe prompt; the cache is cropped back after each step, so every step sees
    the same context). ``prefill_short`` / ``prefill_long``: the forward of a prompt of each length
    with a fresh cache, logits of the last token only (what ``generate`` computes at prefill).
    Samples from several calls of ``sample`` are pooled, so dtypes timed in turn share the machine's
    drift.

    A model built with fewer decoder layers than the real one (``probe_layers``) also times its
    embedding + final norm + lm_head alone on the same inputs; each sample's rest (the layers and
    what runs between them) is scaled by ``layers / built`` and the fixed part counted once."""

    PARTS = ("decode", "prefill_short", "prefill_long")

    def __init__(self, model, dtype: torch.dtype, prompt_tokens: tuple, layers: int):
        self.model, self.dtype, self.layers = model, dtype, layers
        self.built = model.config.num_hidden_layers
        self.short, self.long = prompt_tokens
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, model.config.vocab_size, (1, self.long + 1), generator=gen)
        with torch.inference_mode():  # both prefill shapes once, untimed: every later call is warm
            model(input_ids=self.ids[:, :self.short], use_cache=True, logits_to_keep=1)
            out = model(input_ids=self.ids[:, :self.long], use_cache=True, logits_to_keep=1)
        # the decode step's keyword arguments: its token, the mask over cache + token, the cache
        self.step = {"input_ids": self.ids[:, self.long:], "attention_mask": torch.ones(1, self.long + 1,
                     dtype=torch.long), cache_argument(model): cache_of(out)}
        self.cache = cache_of(out)
        self.samples: dict = {part: [] for part in self.PARTS}
        self.fixed: dict = {part: [] for part in self.PARTS}

    def _decode(self):
        self.model(**self.step, use_cache=True, logits_to_keep=1)
        self.cache.crop(-1)  # drop this step's entry: every call is the same step at the same context

    def _prefill(self, tokens: int):
        return lambda: self.model(input_ids=self.ids[:, :tokens], use_cache=True, logits_to_keep=1)

    def _fixed_part(self, tokens: int):
        embed, head = self.model.get_input_embeddings(), self.model.get_output_embeddings()
        norm = getattr(getattr(self.model, "model", None), "norm", None) or torch.nn.Identity()
        ids = self.ids[:, self.long:] if tokens == 1 else self.ids[:, :tokens]
        return lambda: head(norm(embed(ids))[:, -1:])

    def sample(self, decode_iters: int, prefill_iters: int) -> None:
        """One round: each part through ``bench.measure``. The call ``measure`` makes first to warm
        up is a sample like the others where the part is already warm: the prefills always (both
        shapes ran in ``__init__``), the decode step from the second round on. Prefill calls are the
        probe's cost, and this halves it."""
        calls = {"decode": self._decode, "prefill_short": self._prefill(self.short),
                 "prefill_long": self._prefill(self.long)}
        tokens = {"decode": 1, "prefill_short": self.short, "prefill_long": self.long}
        with torch.inference_mode():
            for part, fn in calls.items():
                iters = decode_iters if part == "decode" else prefill_iters
                t = measure(fn, "cpu", name=part, warmup=1, min_iters=iters, min_seconds=0.0)
                warm = part != "decode" or bool(self.samples["decode"])
                self.samples[part] += ([t.first_call_s] if warm else []) + t.samples
                if self.built < self.layers:
                    self.fixed[part] += measure(self._fixed_part(tokens[part]), "cpu", warmup=1,
                                                min_iters=iters, min_seconds=0.0).samples

    def scaled(self, part: str) -> list:
        """The samples of ``part`` for the whole model (as timed when it was built whole)."""
        if self.built >= self.layers:
            return list(self.samples[part])
        fixed = statistics.median(self.fixed[part])
        return [fixed + (s - fixed) * self.layers / self.built for s in self.samples[part]]

    def row(self, prompt_tokens: int, new_tokens: int) -> dict:
        row = {"dtype": dtype_name(self.dtype), "problem": None, "layers": self.layers,
               "timed_layers": self.built, "prefill_short_tokens": self.short,
               "prefill_long_tokens": self.long, "decode_context_tokens": self.long,
               "samples": len(self.samples["decode"]),
               # the fewest samples any of the row's times stands on (a request time adds the decode
               # step and both prefills): decide reads it, so no direction is said from fewer than 5
               "n_samples": min(len(self.samples[part]) for part in self.PARTS)}
        for part in self.PARTS:
            t = Timing("probe", self.scaled(part))
            row.update({f"{part}_ms": 1e3 * t.median, f"{part}_p10_ms": 1e3 * t.p10, f"{part}_p90_ms": 1e3 * t.p90})
        return {**row, **request_times(row, prompt_tokens, new_tokens)}


def _line(row: dict, suffix: str, prompt_tokens: float) -> float:
    """The prefill time (``suffix`` ``ms``, ``p10_ms`` or ``p90_ms``) at ``prompt_tokens``, on the line
    through the two timed prompt lengths."""
    s, l = row["prefill_short_tokens"], row["prefill_long_tokens"]
    a, b = row[f"prefill_short_{suffix}"], row[f"prefill_long_{suffix}"]
    return a + (b - a) * (prompt_tokens - s) / (l - s)


def request_times(row: dict, prompt_tokens: int = REQUEST_PROMPT_TOKENS,
                  new_tokens: int = REQUEST_NEW_TOKENS) -> dict:
    """A probe row's time for one request: TTFT(prompt_tokens) + new_tokens x one decode step, with
    a p10-p90 spread that adds the parts' own p10s and p90s (never narrower than the median: far
    from the timed lengths the p10 and p90 lines could cross). The decode step is the one timed
    after the longer probe prompt; its growth with the context is left out of this model."""
    parts = {q: _line(row, q, prompt_tokens) + new_tokens * row[f"decode_{q}"]
             for q in ("ms", "p10_ms", "p90_ms")}
    return {"request_ms": parts["ms"], "request_p10_ms": min(parts["p10_ms"], parts["ms"]),
            "request_p90_ms": max(parts["p90_ms"], parts["ms"]), "request_prompt_tokens": prompt_tokens,
            "request_new_tokens": new_tokens}


def faster_beyond_spread(candidate: dict, baseline: dict, phase: str = "request") -> bool:
    """Whether ``candidate``'s whole p10-p90 spread of ``phase`` lies below ``baseline``'s."""
    return candidate[f"{phase}_p90_ms"] < baseline[f"{phase}_p10_ms"]


def clears_margin(candidate: dict, baseline: dict, margin_pct: float = PICK_MARGIN_PCT) -> bool:
    """Whether ``candidate`` serves the request faster than ``baseline`` beyond both spreads and in at
    least ``margin_pct`` % less (median) time: what a challenger needs to replace the incumbent."""
    return (faster_beyond_spread(candidate, baseline)
            and candidate["request_ms"] <= (1 - margin_pct / 100) * baseline["request_ms"])


def _usable(rows: list[dict]) -> dict:
    return {r["dtype"]: r for r in rows if not r.get("problem")}


def pick_cpu_dtype(rows: list[dict], prompt_tokens: Optional[int] = None,
                   new_tokens: Optional[int] = None) -> tuple[str, str]:
    """The decision from ``measure_cpu_dtype``'s probe rows (a row with ``problem`` set is a dtype
    that does not run correctly here): ``(dtype name, decision)``, by the time of one request of
    ``prompt_tokens`` + ``new_tokens`` (the rows' own ``request_*`` times when both are None).

    float32 unless a usable 16-bit dtype serves the request in ``PICK_MARGIN_PCT`` % less time and
    beyond both spreads (16 bits cost precision, so they have to pay for it; ``clears_margin``);
    of the 16-bit dtypes that do, bfloat16 before float16 (float32's range, so no overflow) unless
    float16 clears the same margin against it. ``decision`` is one of ``DTYPE_DECISIONS``.
    """
    by = {r["dtype"]: r for r in rows}
    if "float32" not in by or by["float32"].get("problem"):
        raise ValueError("rows must include a usable float32 row (the baseline)")
    usable = _usable(rows)
    if prompt_tokens is not None or new_tokens is not None:
        p = REQUEST_PROMPT_TOKENS if prompt_tokens is None else prompt_tokens
        n = REQUEST_NEW_TOKENS if new_tokens is None else new_tokens
        usable = {d: {**r, **request_times(r, p, n)} for d, r in usable.items()}
    halves = [usable[d] for d in ("bfloat16", "float16") if d in usable]
    if not halves:
        return "float32", "no_16bit_usable"
    # each 16-bit dtype against float32 first: a bfloat16 that does not pay for its bits must not
    # hide a float16 that does (at Llama-2-7B's widths on an AVX-512 BF16 CPU, float16 served the
    # request in 44 % less time than float32 and bfloat16 did not clear the margin)
    winners = [r for r in halves if clears_margin(r, usable["float32"])]
    if not winners:
        return "float32", "float32_not_slower"
    best = winners[1] if len(winners) > 1 and clears_margin(winners[1], winners[0]) else winners[0]
    return best["dtype"], "16bit_faster"


def _crossings(rows: list[dict], new_tokens: int) -> list[float]:
    """The prompt lengths at which one request-time line (median, p10, p90, or the median less the
    pick's margin) of a dtype meets one of another dtype: the pick, made of such comparisons, can
    change only there."""
    lines = []
    keep = 1 - PICK_MARGIN_PCT / 100  # a challenger's median is held against this share of the incumbent's
    for r in _usable(rows).values():
        for q in ("ms", "p10_ms", "p90_ms"):
            slope = (r[f"prefill_long_{q}"] - r[f"prefill_short_{q}"]) / (
                r["prefill_long_tokens"] - r["prefill_short_tokens"])
            lines.append((r["dtype"], slope, _line(r, q, 0) + new_tokens * r[f"decode_{q}"]))
            if q == "ms":
                lines.append((r["dtype"], keep * slope, keep * lines[-1][2]))
    found = [(c2 - c1) / (s1 - s2) for i, (d1, s1, c1) in enumerate(lines) for d2, s2, c2 in lines[i + 1:]
             if d1 != d2 and s1 != s2]
    return sorted(x for x in found if x == x)  # NaN-free


def flip_lengths(rows: list[dict], prompt_tokens: int = REQUEST_PROMPT_TOKENS,
                 new_tokens: int = REQUEST_NEW_TOKENS, horizon: int = FLIP_HORIZON_TOKENS) -> dict:
    """Where the pick for ``prompt_tokens`` + ``new_tokens`` would change with the prompt's length
    alone (the linear request-time models solved against each other): ``flip_longer_tokens``, the
    shortest longer prompt (up to ``horizon``) with another pick, and ``flip_longer_dtype``, that
    pick; ``flip_shorter_tokens`` / ``flip_shorter_dtype``, the longest shorter prompt (down to 1)
    with another pick. None where the pick holds."""
    chosen = pick_cpu_dtype(rows, prompt_tokens, new_tokens)[0]
    out = {"flip_longer_tokens": None, "flip_longer_dtype": None,
           "flip_shorter_tokens": None, "flip_shorter_dtype": None}
    crossings = _crossings(rows, new_tokens)
    # The pick is constant between crossings, so the first whole length past each one decides.
    longer = sorted({int(x) + 1 for x in crossings if prompt_tokens <= x < horizon})
    shorter = sorted({math.ceil(x) - 1 for x in crossings if 1 < x <= prompt_tokens}, reverse=True)  # all >= 1
    for side, lengths in (("longer", longer), ("shorter", shorter)):
        for p in lengths:
            other = pick_cpu_dtype(rows, p, new_tokens)[0]
            if other != chosen:
                out.update({f"flip_{side}_tokens": p, f"flip_{side}_dtype": other})
                break
    return out


def _reason(decision: str, rows: list[dict], chosen: str, flips: Optional[dict] = None) -> prose.Message:
    by = {r["dtype"]: r for r in rows}
    f32 = by["float32"]
    flips = flips or {}
    if decision == "no_16bit_usable":
        why = [message("{dtype}: {problem}", dtype=r["dtype"], problem=r["problem"]) for r in rows if r.get("problem")]
        return message("float32: no 16-bit dtype runs correctly here ({why})", why=why)
    request = message("{prompt}-token prompt + {new} new tokens", prompt=f32["request_prompt_tokens"],
                      new=f32["request_new_tokens"])
    if decision == "16bit_faster":
        c = by[chosen]
        text = message("{dtype}: the model's forward served a {request} in {ms:.0f} ms in {dtype} against "
                       "{f32_ms:.0f} ms in float32 on this CPU, spreads apart and at least {margin} % less",
                       dtype=chosen, request=request, ms=c["request_ms"], f32_ms=f32["request_ms"],
                       margin=PICK_MARGIN_PCT)
    else:
        alt = min((r for r in rows if r["dtype"] != "float32" and not r.get("problem")),
                  key=lambda r: r["request_ms"])
        text = message("float32: no 16-bit dtype serves a {request} in {margin} % less time, beyond the "
                       "spread, here ({other} {other_ms:.0f} ms vs float32 {f32_ms:.0f} ms)", request=request,
                       margin=PICK_MARGIN_PCT, other=alt["dtype"], other_ms=alt["request_ms"],
                       f32_ms=f32["request_ms"])
    if flips.get("flip_longer_tokens"):
        text = message("{reason}; from {tokens}-token prompts on it would be {dtype}", reason=text,
                       tokens=flips["flip_longer_tokens"], dtype=flips["flip_longer_dtype"])
    if flips.get("flip_shorter_tokens"):
        text = message("{reason}; for prompts of {tokens} tokens or fewer it would be {dtype}", reason=text,
                       tokens=flips["flip_shorter_tokens"], dtype=flips["flip_shorter_dtype"])
    return text


@dataclass
class DtypeChoice:
    """The working dtype of a run, with the figures that decided it."""

    dtype: torch.dtype
    reason: str
    source: str  # "measured now", "recorded by chapter 00 of this run" or "fixed for <device>"
    rows: list = field(default_factory=list)
    decision: str = ""
    shapes_source: str = ""
    cpu_capability: str = ""
    threads: int = 0
    request_prompt_tokens: int = REQUEST_PROMPT_TOKENS
    request_new_tokens: int = REQUEST_NEW_TOKENS
    flip_longer_tokens: Optional[int] = None
    flip_longer_dtype: Optional[str] = None
    flip_shorter_tokens: Optional[int] = None
    flip_shorter_dtype: Optional[str] = None
    flip_horizon_tokens: int = FLIP_HORIZON_TOKENS
    pick_margin_pct: Optional[float] = None  # the margin the pick was made with (None: none, or not timed)

    def record(self) -> dict:
        """The context chapter 00 stores with the ``dtype_choice`` figure (later chapters read it)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dtype"}


_MEASURED: dict = {}


def _probe_models(widths, budget: int, dtypes: list) -> tuple[dict, int]:
    """One randomly initialised probe model per dtype (the same weights, rounded to each), eval mode,
    and the real model's layer count."""
    from transformers import AutoModelForCausalLM

    built, layers = probe_layers(widths, budget)
    config = probe_config(widths, built)
    with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(config)
    base.float().eval().requires_grad_(False)
    return {d: (base if d == torch.float32 else copy.deepcopy(base).to(d)) for d in dtypes}, layers


def measure_cpu_dtype(model=None, *, prompt_tokens: int = REQUEST_PROMPT_TOKENS,
                      new_tokens: int = REQUEST_NEW_TOKENS, probe_prompts: tuple = PROBE_PROMPT_TOKENS,
                      budget: int = PROBE_BYTES, rounds: int = 2, decode_iters: int = 3,
                      prefill_iters: int = 2) -> DtypeChoice:
    """Time the model's real forward (built from its config with random weights) in float32,
    bfloat16 and float16: one decode step with a KV cache and the prefill at the two
    ``probe_prompts`` lengths, ``rounds`` alternating rounds with samples pooled per dtype; pick the
    dtype that serves ``prompt_tokens`` + ``new_tokens`` fastest with ``pick_cpu_dtype`` and say
    where the pick would flip (``flip_lengths``). With the defaults each dtype gives 7 decode steps
    and 6 prefills of each length (plus one untimed of each), so every row has the
    ``decide.MIN_SAMPLES`` a direction word needs (its ``n_samples``); the long prefill in float16
    on a CPU without float16 arithmetic is most of the cost. The probe models are freed before returning."""
    for name, value in (("prompt_tokens", prompt_tokens), ("new_tokens", new_tokens), ("rounds", rounds),
                        ("decode_iters", decode_iters), ("prefill_iters", prefill_iters)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is not valid; it must be an integer >= 1")
    if len(probe_prompts) != 2 or not 1 <= probe_prompts[0] < probe_prompts[1]:
        raise ValueError(f"probe_prompts={probe_prompts!r} is not valid; give two prompt lengths, "
                         "shorter first, both >= 1")
    widths, source = widths_of(model)
    problems = {d: None if d == torch.float32 else dtype_problem(d) for d in CPU_CANDIDATE_DTYPES}
    models, layers = _probe_models(widths, budget, [d for d, p in problems.items() if not p])
    try:
        probes = {d: _ForwardProbe(m, d, tuple(probe_prompts), layers) for d, m in models.items()}
        # dtypes in turn, samples pooled: a load change hits all of them alike
        for _ in progress.steps(range(rounds), lambda _: prose.N_("dtype probe round")):
            for probe in probes.values():
                probe.sample(decode_iters, prefill_iters)
        rows = [probes[d].row(prompt_tokens, new_tokens) if d in probes
                else {"dtype": dtype_name(d), "problem": p} for d, p in problems.items()]
    finally:
        probes = models = None  # the probe models and their caches go before the real model loads
        return_freed_heap()
    chosen, decision = pick_cpu_dtype(rows)
    flips = flip_lengths(rows, prompt_tokens, new_tokens)
    return DtypeChoice(DTYPES[chosen], _reason(decision, rows, chosen, flips), message("measured now"), rows,
                       decision, source, cpu_capability(), torch.get_num_threads(),
                       prompt_tokens, new_tokens, **flips, pick_margin_pct=PICK_MARGIN_PCT)


def recorded_dtype_choice(run_dir=None) -> Optional[DtypeChoice]:
    """Chapter 00's recorded choice in this run's folder (``run_dir``, else ``$WORKBOOK_RUN_DIR``),
    when it was made at this CPU kernel level and thread count; else None."""
    folder = run_dir or os.environ.get(RUN_DIR_ENV)
    if not folder:
        return None
    metrics = (load_results(folder, "00_environment_check") or {}).get("metrics") or {}
    entry = metrics.get(DTYPE_CHOICE_KEY)
    if (not entry or entry.get("value") not in DTYPES or entry.get("cpu_capability") != cpu_capability()
            or entry.get("threads") != torch.get_num_threads()):
        return None
    kept = {f.name: entry[f.name] for f in fields(DtypeChoice)
            if f.name not in ("dtype", "reason", "source") and f.name in entry}
    return DtypeChoice(DTYPES[entry["value"]], prose.recorded(entry, "reason"),
                       message("recorded by chapter 00 of this run"), **kept)


def choose_dtype(device, model=None, *, run_dir=None, reuse: bool = True) -> DtypeChoice:
    """The working dtype with its reason: fp16 on NPU/CUDA; on a CPU, chapter 00's recorded choice
    of this run when ``reuse`` (and it was made on this CPU), else measured now, once per process.

    Chapter 00 passes ``reuse=False``: it is the chapter that measures and records the choice.
    """
    kind = as_device(device).type
    if kind in ("npu", "cuda"):
        return DtypeChoice(torch.float16, message("float16: the guides' inference dtype and native on {device}",
                                                  device=kind), message("fixed for {device}", device=kind))
    if reuse and (recorded := recorded_dtype_choice(run_dir)) is not None:
        return recorded
    widths, _ = widths_of(model)
    key = (repr(linear_shapes(widths)), cpu_capability(), torch.get_num_threads())
    if key not in _MEASURED or not reuse:
        _MEASURED[key] = measure_cpu_dtype(model)
    return _MEASURED[key]


def parse_dtype(value, device=None, parameter: str = "dtype", *, model=None, run_dir=None) -> torch.dtype:
    """Turn ``"auto"``/``"bf16"``/``torch.float16`` into a dtype the device supports, or raise.

    ``"auto"`` is ``choose_dtype``: fp16 on NPU/CUDA; on a CPU chapter 00's choice of this run, or
    measured at ``model``'s shapes (the embedded model's when none is named). Every other value is
    ``backend.named_dtype``'s.
    """
    if not isinstance(value, torch.dtype) and str(value).strip().lower() == "auto":
        return choose_dtype(device or "cpu", model, run_dir=run_dir).dtype
    return named_dtype(value, device, parameter)
