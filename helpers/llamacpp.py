"""llama.cpp as the CPU reference of the ladder: the embedded GGUF, measured in the same run.

Layer: model and kernels. Taught in ``06_optimization_ladder.ipynb``.
``scripts/setup_llamacpp.sh`` (called by
``scripts/setup.sh``) builds ``llama-cpp-python`` into the venv where a C++ compiler is present and
writes what happened to ``<venv>/llamacpp-status.json``; ``availability()`` reads it, so a build that
failed (or was skipped) gives the reason instead of a figure, and the rest of the workbook runs.

``measure()`` runs llama.cpp on the same token ids, lengths and threads as the ladder, with the
workbook's protocol (``helpers.generation.measure_generation``'s definitions): greedy, a fixed number
of new tokens (end-of-sequence never stops it), one untimed warm-up, several repeats; TTFT is a
1-token generation, and decode per token is the median, p10 and p90 of every decode step, stamped
after each step's ``eval`` and argmax (``repeats x (N - 1)`` samples), with the difference of two
generates, ``(t(N) - t(1)) / (N - 1)``, kept beside it as the same cross-check the rungs carry.
It runs in a child process: a child that dies of a signal (an illegal instruction, a segmentation
fault, a bus error) becomes the row's reason instead of a dead notebook kernel. llama.cpp's extra
buffer types (AMX tiles, repacked weights) die that way on some CPUs and VMs whose flags promise
the instructions, so a child that dies with them is run again without them, and the row says so.

llama.cpp reads the GGUF's own Q4_1 blocks (about 4.5 bits per weight); the ladder's model is the
same weights dequantized to 16 or 32 bits. Its figures stand beside the ladder and are never part
of the ladder's own ratios.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

VERSION = "0.3.36"  # the llama-cpp-python release scripts/setup_llamacpp.sh builds
STATUS_FILE = "llamacpp-status.json"  # in the venv, written by scripts/setup_llamacpp.sh
DEFAULT_TIMEOUT_S = 600


def status_path() -> Path:
    """``<venv>/llamacpp-status.json`` of the interpreter running this code."""
    return Path(sys.prefix) / STATUS_FILE


def read_setup_status() -> dict:
    """What the setup step recorded (``status``: installed / failed / skipped, ``reason``,
    ``build_s``), or ``{}`` when it never ran for this venv."""
    try:
        return json.loads(status_path().read_text())
    except (OSError, ValueError):
        return {}


def installed_version() -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return None


def availability() -> dict:
    """``{"available": bool, "version", "reason", "setup"}`` without importing llama_cpp here."""
    setup, version = read_setup_status(), installed_version()
    reason = ""
    if version is None and setup.get("status") in ("failed", "skipped"):
        reason = f"llama-cpp-python was not installed by setup ({setup['status']}: {setup.get('reason', '')})"
    elif version is None:
        reason = ("llama-cpp-python is not installed in this environment; `make setup` builds it "
                  "where a C++ compiler is present (scripts/setup_llamacpp.sh)")
    return {"available": version is not None, "version": version, "reason": reason, "setup": setup}


def measure(gguf, prompt_ids, new_tokens: int, *, threads: Optional[int] = None, repeats: int = 3,
            timeout: float = DEFAULT_TIMEOUT_S, extra_buffers: Optional[bool] = None) -> dict:
    """Decode tok/s and TTFT of llama.cpp on ``prompt_ids``, in a child process.

    ``extra_buffers``: None (the default) runs with llama.cpp's extra buffer types and again
    without them when that child dies of a signal; True or False runs only that way.

    Returns ``{"status": "ok", "ttft_ms", "decode_ms_per_token", "tokens_per_s", p10/p90 of both,
    "samples", "tokens", "system_info", ...}``, or ``{"status": "unavailable" | "failed", "reason"}``.
    """
    from .params import check_positive_int  # here: the child runs this file as a script

    check_positive_int("new_tokens", new_tokens, minimum=2)
    check_positive_int("repeats", repeats)
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("prompt_ids is empty; give the ladder's prompt token ids")
    found = availability()
    if not found["available"]:
        return {"status": "unavailable", "reason": found["reason"]}
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    gguf = Path(gguf)
    weights = gguf.stem.rsplit(".", 1)[-1] if "." in gguf.stem else "unknown"  # x.Q4_1.gguf: Q4_1
    if extra_buffers not in (None, True, False):
        raise ValueError(f"extra_buffers={extra_buffers!r} is not valid; use None (with, then without on a "
                         "crash), True or False")
    request = {"gguf": str(gguf), "prompt_ids": ids, "new_tokens": new_tokens, "threads": int(threads),
               "repeats": repeats, "extra_buffers": extra_buffers is not False}
    out, failure = _run_child(request, timeout)
    note = ""
    if failure and died_of_signal(failure[0]) and extra_buffers is None:
        # llama.cpp's extra buffer types (AMX tiles, repacked weights) die on some CPUs and VMs whose
        # flags promise the instructions; without them it runs its AVX / VNNI kernels. Any signal:
        # SIGILL on an AMX VM, SIGSEGV or SIGBUS elsewhere. The row says which one ran and why.
        first = failure[1]
        out, failure = _run_child({**request, "extra_buffers": False}, timeout)
        note = (f"with llama.cpp's extra buffer types (AMX tiles / repacked weights) the child died ({first}); "
                "measured without them (use_extra_bufts=False)")
    if failure:
        reason = failure[1] if not note else f"{failure[1]} (and before that, {note.split('; ')[0]})"
        return {"status": "failed", "reason": reason}
    used = request["extra_buffers"] and not note
    return {**summarize(out, new_tokens), "version": found["version"], "quantization": weights,
            "gguf": gguf.name, "gguf_path": str(gguf), "threads": int(threads), "prompt_tokens": len(ids),
            "new_tokens": new_tokens, "repeats": repeats, "note": note, "extra_buffers": used,
            "code_path": (f"llama-cpp-python {found['version']} (llama.cpp), Llama.eval + argmax, greedy, "
                          f"{new_tokens} new tokens, decode stamped per step, {threads} threads, "
                          f"weights {weights} from the GGUF{'' if used else ', use_extra_bufts=False'}")}


# Exit codes of a child killed by a signal: subprocess gives -N; a shell in between gives 128 + N.
SIGNAL_NAMES = {4: "illegal instruction (SIGILL)", 6: "abort (SIGABRT)", 7: "bus error (SIGBUS)",
                8: "floating-point exception (SIGFPE)", 11: "segmentation fault (SIGSEGV)"}


def died_of_signal(returncode) -> bool:
    """Whether a child's return code says a signal killed it (not a timeout, not an exit code)."""
    return returncode is not None and (returncode < 0 or 128 < returncode < 160)


def _run_child(request: dict, timeout: float):
    """``(result, None)`` or ``(None, (returncode, reason))`` of one child run of ``_bench``."""
    threads = str(request["threads"])
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--bench"],
                              input=json.dumps(request), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": threads})
    except subprocess.TimeoutExpired:
        return None, (None, f"llama.cpp did not finish within {timeout:.0f} s")
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1]), None
    tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])[:400]
    why = f"exit code {proc.returncode}"
    if died_of_signal(proc.returncode):
        number = -proc.returncode if proc.returncode < 0 else proc.returncode - 128
        buffers = "with" if request.get("extra_buffers", True) else "without"
        why = f"died of {SIGNAL_NAMES.get(number, f'signal {number}')} {buffers} its extra buffer types"
        if number == 4 and not request.get("extra_buffers", True):
            # only the plain kernels were left: the build itself uses an instruction this CPU lacks
            why += (": the build uses an instruction this CPU does not run (a wheel built on another "
                    "CPU, e.g. from a pip cache shared between machines); rebuild it here with "
                    "`pip cache remove llama_cpp_python` and `make setup`")
    return None, (proc.returncode, f"llama.cpp {why}" + (f": {tail}" if tail else ""))


def summarize(raw: dict, new_tokens: int) -> dict:
    """The child's stamps -> TTFT and decode per token with ``generation.timing_figures``, the
    definition every rung's figures come from: TTFT over the 1-token generates; decode over every
    step interval of the timed N-token generates; the two-generates difference as the cross-check."""
    steps = raw.get("step_s") or []
    if not raw["first_s"] or len(raw["first_s"]) != len(raw["full_s"]) or len(steps) != len(raw["full_s"]):
        raise ValueError("raw must hold as many 1-token timings, full timings and step lists "
                         "(first_s, full_s, step_s)")
    if any(len(run) != new_tokens - 1 for run in steps):
        raise ValueError(f"each step_s list must hold new_tokens - 1 = {new_tokens - 1} decode steps")
    two = [(full - one) / (new_tokens - 1) for full, one in zip(raw["full_s"], raw["first_s"])]
    return {"status": "ok", **_figures(raw["first_s"], [x for run in steps for x in run], two),
            "tokens": raw.get("tokens", []), "system_info": raw.get("system_info", ""),
            "load_s": raw.get("load_s")}


def _figures(ttft_s: list, decode_s: list, two_generates_s: list) -> dict:
    from .generation import timing_figures

    out = timing_figures(ttft_s, decode_s, 1, "cpu", two_generates_s)
    out["tokens_per_s"] = out.pop("tokens_per_s_per_user")
    out.pop("tokens_per_s_aggregate")
    return out


def pool(runs: list) -> dict:
    """The ok runs of ``measure`` (one per round, interleaved with the ladder's rounds) as one row:
    their decode and TTFT samples pooled, medians with p10 / p90 of all of them; the first run that
    was not ok when none was (its reason then stands)."""
    ok = [r for r in runs if r.get("status") == "ok"]
    if not ok:
        return next(iter(runs), {"status": "skipped", "reason": "llama.cpp was not run"})
    pooled = _figures([x / 1e3 for r in ok for x in r["ttft_samples_ms"]],
                      [x / 1e3 for r in ok for x in r["decode_samples_ms"]],
                      [x / 1e3 for r in ok for x in r.get("decode_two_generates_samples_ms", [])])
    return {**ok[0], **pooled, "rounds": len(ok), "repeats": sum(r.get("repeats", 0) for r in ok),
            "code_path": ok[0].get("code_path", "") + f", {len(ok)} runs interleaved with the ladder's rounds, pooled"}


# What llama.cpp runs per weight format on a CPU, for the step part that stands in a rung's way.
KERNELS = {
    "matmul kernels": ("ggml's quantized dot products: the activations are quantized to 8 bits per block of 32 "
                       "(Q8_0 / Q8_1) once per step, and each Q4_0 / Q4_1 / Q8_0 weight block is multiplied "
                       "with them in integer SIMD (vec_dot_q4_1_q8_1, vec_dot_q8_0_q8_0; AVX2 / AVX-512 VNNI, "
                       "repacked or AMX tiles where the CPU has them), never dequantizing a weight to 16 bits"),
    "the rest of the step": ("one ggml graph per step in C, its nodes run by one pool of threads with no Python, "
                             "no per-operator dispatch and the norms, RoPE and attention as single fused loops"),
}


def bytes_per_step(gguf, context_len: int) -> dict:
    """What one llama.cpp decode step reads (batch 1): every tensor of the GGUF once, in its own
    format (Q4_1 blocks, Q8_0, F32 norms), except an input embedding with a separate output matrix
    (then one row of it), plus the KV cache in float16 (llama.cpp's default) at ``context_len``
    tokens. Read with the ``gguf`` package from the file llama.cpp runs."""
    import gguf as gguf_lib

    if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 0:
        raise ValueError(f"context_len={context_len!r} must be an integer >= 0")
    reader = gguf_lib.GGUFReader(str(gguf))
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}

    def field(name):
        found = reader.fields.get(name)
        return int(found.parts[-1][0]) if found is not None else None

    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    layers, heads = field(f"{arch}.block_count"), field(f"{arch}.attention.head_count")
    kv_heads, width = field(f"{arch}.attention.head_count_kv") or heads, field(f"{arch}.embedding_length")
    weights = sum(tensors.values())
    if "output.weight" in tensors and "token_embd.weight" in tensors:  # untied: a lookup of one row
        vocab = field(f"{arch}.vocab_size") or 1
        weights -= tensors["token_embd.weight"] - tensors["token_embd.weight"] // vocab
    kv = 2 * layers * kv_heads * (width // heads) * context_len * 2
    return {"weight_bytes": weights, "kv_cache_bytes": kv, "bytes_per_step": weights + kv,
            "context_len": context_len}


def _bench(request: dict) -> dict:
    """Runs in the child: load the GGUF, time 1-token and N-token greedy generations."""
    import llama_cpp.llama_cpp as api
    import numpy as np
    from llama_cpp import Llama, llama_print_system_info

    if not request.get("extra_buffers", True):
        defaults = api.llama_model_default_params

        def without_extra_buffers():
            params = defaults()
            params.use_extra_bufts = False
            return params

        api.llama_model_default_params = without_extra_buffers  # what Llama() builds its params from
    ids, n, reps = request["prompt_ids"], request["new_tokens"], request["repeats"]
    start = time.perf_counter()
    llm = Llama(model_path=request["gguf"], n_ctx=len(ids) + n + 8, n_batch=max(len(ids), 8),
                n_threads=request["threads"], n_threads_batch=request["threads"], verbose=False)
    load_s = time.perf_counter() - start
    vocab = llm.n_vocab()

    def argmax() -> int:
        return int(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(vocab,)).argmax())

    def generate(count: int, stamps: Optional[list] = None) -> list:
        llm.reset()  # the next eval drops the KV cache from position 0: no prefix reuse
        llm.eval(ids)
        out = [argmax()]
        if stamps is not None:
            stamps.append(time.perf_counter())  # after the first token: the decode steps start here
        for _ in range(count - 1):
            llm.eval([out[-1]])
            out.append(argmax())
            if stamps is not None:
                stamps.append(time.perf_counter())
        return out

    tokens = generate(n)  # warm-up, untimed
    first, full, steps = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        generate(1)
        first.append(time.perf_counter() - t0)
        stamps: list = []
        t0 = time.perf_counter()
        generate(n, stamps)
        full.append(time.perf_counter() - t0)
        steps.append([b - a for a, b in zip(stamps, stamps[1:])])
    info = llama_print_system_info()
    return {"first_s": first, "full_s": full, "step_s": steps, "tokens": tokens, "load_s": load_s,
            "system_info": info.decode(errors="replace") if isinstance(info, bytes) else str(info)}


if __name__ == "__main__" and sys.argv[1:] == ["--bench"]:
    print(json.dumps(_bench(json.loads(sys.stdin.read()))))
