"""The fault table (docs/troubleshooting.md): rows not covered by the module tests are tried here.

| fault | test |
|---|---|
| torch_npu without CANN breaks ``import torch`` | test_torch_npu_autoload_without_cann_* (here) |
| torch / torch_npu versions do not pair | test_versions.py::test_pairing_* |
| device=npu without an NPU | test_backend.py::test_broken_torch_npu_auto_falls_back_and_explicit_npu_raises |
| no network / unknown model / missing path | test_models.py::test_bad_model_names_*, test_hub_id_* |
| bad parameters | test_params.py, test_models.py::test_bad_dtype_and_source_fail_before_loading |
| OOM in a sweep point | test_backend.py::test_*out_of_memory* |
| a notebook fails mid-run | test_runner.py |
| the run is interrupted | test_interrupted_run_* (here), test_results.py::test_*intact |
| the kernel dies | test_runner.py::test_kernel_death_is_reported_as_such_not_a_hang |
| unwritable report / cache folder | test_runner.py, test_models.py, test_results.py ::test_unwritable_* |
| secrets in reports | test_environment_report_* (here), test_runner.py::test_run_files_never_include_secrets |
| trust_remote_code | test_models.py::test_*trust_remote_code*, test_runner.py::test_every_profile_* |
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import backend
from helpers.results import Results, load_results

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "runner_notebooks"


# --- torch_npu installed, CANN missing ------------------------------------------------------

@pytest.fixture
def wheel_without_cann(tmp_path):
    """A site folder where torch_npu registers torch's auto-load entry point but cannot load.

    This is what ``pip install torch_npu`` on a machine without CANN looks like to torch: the
    entry point exists, and importing torch_npu fails on a missing CANN library.
    """
    site = tmp_path / "site"
    dist = site / "torch_npu-2.13.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    (site / "torch_npu.py").write_text(
        'raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n')
    return site


def _clean_env(site, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ASCEND_", "TORCH_DEVICE_BACKEND")) and k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env.update(extra)
    return env


def test_torch_npu_autoload_without_cann_falls_back_for_auto_and_refuses_npu(wheel_without_cann):
    code = textwrap.dedent("""
        import os
        import helpers
        from helpers import backend
        print("AUTOLOAD", os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"))
        print("AUTO", backend.pick_device("auto").reason)
        try:
            backend.pick_device("npu")
        except RuntimeError as exc:
            print("NPU", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=_clean_env(wheel_without_cann),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["AUTOLOAD"] == "0"
    assert "running on the CPU" in lines["AUTO"] and "libhccl.so" in lines["AUTO"]
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0 was set" in lines["AUTO"]
    assert "devices found: cpu" in lines["NPU"] and "set_env.sh" in lines["NPU"]


def test_torch_npu_autoload_forced_on_explains_the_fix(wheel_without_cann):
    """With auto-loading forced on, 'import torch' really fails; the message names both fixes."""
    proc = subprocess.run([sys.executable, "-c", "import helpers"],
                          env=_clean_env(wheel_without_cann, TORCH_DEVICE_BACKEND_AUTOLOAD="1"),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: 'import torch' failed while auto-loading torch_npu")
    assert "Failed to load the backend extension" in last  # torch's own error, kept
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in last and "set_env.sh" in last


# --- interrupted runs -----------------------------------------------------------------------

def test_interrupted_run_keeps_results_and_resume_skips_finished_chapters(tmp_path):
    reports = tmp_path / "reports"
    cmd = [sys.executable, "-m", "helpers.run", "--profile", "quick", "--notebooks-dir", str(FIXTURES),
           "--reports-dir", str(reports), "--no-html", "--only", "01", "05"]
    proc = subprocess.Popen(cmd + ["--run-id", "cut", "-p", "nap=60"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    for line in proc.stdout:  # wait until the second notebook is running, then press Ctrl-C
        if "05_naps ..." in line:
            time.sleep(1)
            break
        assert time.monotonic() < deadline
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "--resume" in err
    run_dir = reports / "cut"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "interrupted"
    assert [(e["notebook"], e["status"]) for e in run["notebooks"]] == [("01_ok", "ok"), ("05_naps", "failed")]
    assert run["notebooks"][1]["failure"] == "interrupted"
    first = load_results(run_dir, "01_ok")
    assert first["status"] == "ok" and first["metrics"]["fixture_value"]["value"] == 1

    # --resume without --run-id continues the run reports/latest points to.
    resumed = subprocess.run(cmd + ["--resume", "-p", "nap=0"], cwd=REPO, capture_output=True,
                             text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "01_ok: ok in an earlier attempt, skipped" in resumed.stdout
    run = json.loads((run_dir / "run.json").read_text())
    assert [(e["notebook"], e["status"], e.get("resumed", False)) for e in run["notebooks"]] == [
        ("01_ok", "ok", True), ("05_naps", "ok", False)]
    assert load_results(run_dir, "01_ok") == first  # not executed again


def _kernels_of(pid: int) -> list[int]:
    """Live ipykernel processes whose parent is ``pid`` (the runner's kernels)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"ipykernel" in cmdline:
            found.append(int(stat.parent.name))
    return found


def test_a_terminated_run_leaves_no_kernel_behind(tmp_path):
    """SIGTERM (kill, a CI timeout) takes the Ctrl-C path: the kernel is shut down, the run resumable."""
    cmd = [sys.executable, "-m", "helpers.run", "--profile", "quick", "--notebooks-dir", str(FIXTURES),
           "--reports-dir", str(tmp_path), "--no-html", "--only", "05", "--run-id", "term", "-p", "nap=120"]
    proc = subprocess.Popen(cmd, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not _kernels_of(proc.pid):  # wait until the notebook's kernel runs
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.5)
    time.sleep(2)
    kernels = _kernels_of(proc.pid)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    run = json.loads((tmp_path / "term" / "run.json").read_text())
    assert run["status"] == "interrupted" and run["notebooks"][0]["failure"] == "interrupted"
    time.sleep(1)
    alive = [k for k in kernels if Path(f"/proc/{k}").exists()
             and "Z" not in (Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0])]
    assert not alive, f"kernels left running after SIGTERM: {alive}"


def test_a_chapter_killed_mid_run_keeps_its_figures(tmp_path):
    """Results are saved at every record(), so figures measured before a crash survive it."""
    code = textwrap.dedent(f"""
        import os
        from helpers.results import Results
        r = Results("03_end_to_end", {str(tmp_path)!r})
        r.record("ttft_ms", 12.5, "ms", device="cpu")
        os.kill(os.getpid(), 9)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    data = load_results(tmp_path, "03_end_to_end")
    assert data["status"] == "running" and data["metrics"]["ttft_ms"]["value"] == 12.5


# --- no secrets in reports ------------------------------------------------------------------

SECRETS = {
    "HF_TOKEN": "hf_" + "A" * 34,
    "HUGGING_FACE_HUB_TOKEN": "hf_" + "B" * 34,
    "MODELSCOPE_API_TOKEN": "ms-secret-value-123",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value-456",
    "OBS_SECRET_KEY": "obs-secret-value-789",
    "GITHUB_TOKEN": "ghp_secretvalue000",
    "WANDB_API_KEY": "wandb-secret-value",
    "OPENAI_API_KEY": "sk-secret-value",
}


def test_environment_report_never_includes_tokens_or_secrets(monkeypatch, tmp_path):
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HF_ENDPOINT", "https://user:mirror-password-000@mirror.example/")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    report = backend.environment_report("cpu")
    text = json.dumps(report)
    for key, value in SECRETS.items():
        assert value not in text and key not in text
    assert "mirror-password-000" not in text
    assert report["env"]["HF_ENDPOINT"] == "https://***@mirror.example/"
    assert report["env"]["OMP_NUM_THREADS"] == "2"  # harmless variables are still reported
    assert set(report["env"]) <= set(backend.REPORTED_ENV_VARS)

    r = Results("00_environment_check", tmp_path, environment=report)
    saved = r.path.read_text()
    assert not any(value in saved for value in SECRETS.values())
