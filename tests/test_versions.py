"""Support floor, torch / torch_npu pairing, feature detection and the guide-API table."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from helpers import environment_study, guide_api, versions

REPO = Path(__file__).resolve().parent.parent


# What the guide's Python 3.8 image runs before any floor check: the package's first file and the
# scripts setup runs with the image's interpreter. None may use a construct newer than 3.8 (a
# SyntaxError or TypeError there would hide the message that names an image that works).
PY38_FILES = ("helpers/__init__.py", "scripts/detect_system_torch.py", "scripts/choose_pin_set.py")


def _py38_violations(*paths) -> subprocess.CompletedProcess:
    """vermin (pinned in both sets) on ``paths`` for Python 3.8, annotations evaluated and PEP 604
    unions counted as the feature they are."""
    from test_py39 import _vermin

    return subprocess.run([_vermin(), "-t=3.8-", "--no-tips", "--violations", "--eval-annotations",
                           "--feature", "union-types", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_what_the_py38_image_runs_first_needs_nothing_newer_than_38():
    """On the guide's py38 image the floor message must appear, not a SyntaxError."""
    for name in PY38_FILES:
        ast.parse((REPO / name).read_text(), feature_version=(3, 8))
    proc = _py38_violations(*(REPO / name for name in PY38_FILES))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("source", ["def f(x: int | None = None):\n    return x",
                                    "match 1:\n    case 1:\n        pass", "d = {} | {}",
                                    "print('ab'.removeprefix('a'))"])
def test_the_py38_check_catches_a_newer_construct(tmp_path, source):
    path = tmp_path / "bad.py"
    path.write_text(source + "\n")
    assert _py38_violations(path).returncode != 0, source


def test_old_python_gets_the_image_advice(monkeypatch):
    source = (REPO / "helpers" / "__init__.py").read_text()
    monkeypatch.setattr(sys, "version_info", (3, 8, 10, "final", 0))
    monkeypatch.setattr(sys, "version", "3.8.10 (default)")
    with pytest.raises(ImportError) as err:
        exec(compile(source, "helpers/__init__.py", "exec"), {"__name__": "helpers_py38_check"})
    message = str(err.value)
    assert "Python >= 3.9" in message and "3.8.10" in message
    assert "euler2.9-py38-torch2.1.0" in message and "Python 3.9+" in message
    assert "pytorch_2.1.0-cann_8.0.rc2-py_3.9-euler_2.10.7-aarch64-snt9b" in message


def test_torch_floor():
    versions.check_support_floor("2.1.0")
    versions.check_support_floor("2.13.0+cpu")
    with pytest.raises(ImportError, match=r"torch >= 2\.1\.0, found 2\.0\.1.*torch_npu"):
        versions.check_support_floor("2.0.1")


def test_transformers_range():
    assert versions.check_transformers("5.24.0") is None
    assert "outside the tested range" in versions.check_transformers("6.1.0")
    versions.check_transformers_floor("5.24.0")
    with pytest.raises(ImportError, match=r"transformers >= 4\.56\.0.*found 4\.38\.2.*make setup"):
        versions.check_transformers_floor("4.38.2")
    with pytest.warns(UserWarning, match="outside the tested range"):
        versions.check_transformers_floor("6.0.0")


def test_installed_transformers_is_in_range():
    assert versions.check_transformers() is None


def test_pairing_mismatch_names_both_versions_and_the_matching_one():
    out = environment_study.pairing_check("2.13.0+cpu", "2.1.0.post10")
    assert out["ok"] is False
    assert "2.13.0+cpu" in out["verdict"] and "2.1.0.post10" in out["verdict"]
    assert "needs torch 2.1.0" in out["advice"] and out["matching_torch"] == "2.1.0"


def test_pairing_mismatch_suggests_a_known_torch_npu_for_this_torch():
    out = environment_study.pairing_check("2.6.0", "2.5.1")
    assert out["matching_torch_npu"] == "2.6.0.post5" and "torch_npu 2.6.0.post5" in out["advice"]


def test_pairing_ok_known_good_and_cann_drift():
    good = environment_study.pairing_check("2.1.0", "2.1.0.post10", "8.0.0")
    assert good["ok"] is True and good["verdict"].startswith("known-good")
    drift = environment_study.pairing_check("2.1.0", "2.1.0.post10", "8.3.RC1")
    assert drift["ok"] is True and "8.3.RC1" in drift["verdict"] and "8.0.0" in drift["advice"]
    unknown = environment_study.pairing_check("2.7.1", "2.7.1.post99")
    assert unknown["ok"] is True and "not in the known-good table" in unknown["advice"]
    image = environment_study.pairing_check("2.7.1", "2.7.1", "8.3.RC1")  # the pytorch_2.7.1-cann_8.3.rc1 image
    assert image["verdict"].startswith("known-good")
    assert environment_study.pairing_check("2.13.0", None)["ok"] is None


def test_known_good_rows_pair_with_themselves():
    for row in versions.KNOWN_GOOD:
        assert versions.version_tuple(row["torch"]) == versions.version_tuple(row["torch_npu"])


FEATURES = {
    "F.rms_norm": (torch.nn.functional, "rms_norm"),
    "nn.RMSNorm": (torch.nn, "RMSNorm"),
    "torch.accelerator": (torch, "accelerator"),
    "torch._weight_int8pack_mm": (torch, "_weight_int8pack_mm"),
    "torch.compile": (torch, "compile"),
}


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_has_feature_follows_what_torch_has(monkeypatch, name):
    owner, attr = FEATURES[name]
    assert versions.has_feature(name) is True  # torch 2.13 here has all of them
    monkeypatch.delattr(owner, attr)
    assert versions.has_feature(name) is False
    assert environment_study.feature_table()[name] is False


def test_unknown_feature_is_an_error_listing_the_known_ones():
    with pytest.raises(KeyError, match="known: F.rms_norm"):
        versions.has_feature("torch.magic")


def test_api_check_without_torch_npu_cannot_verify():
    rows = guide_api.api_check(None)
    assert {r["guide_name"] for r in rows} >= {"torch_npu.npu.rms_norm", "torch_npu.npu.fused_add_norm"}
    assert all(r["exists_here"] is None for r in rows)
    assert all(r["available_here"] is None for r in environment_study.real_ops_check(None))


def test_api_check_with_the_fake_torch_npu(fake_torch_npu):
    rows = {r["guide_name"]: r for r in guide_api.api_check(fake_torch_npu)}
    assert rows["torch_npu.npu.rms_norm"]["exists_here"] is False  # the guide's name is wrong
    ops = {r["op"]: r["available_here"] for r in environment_study.real_ops_check(fake_torch_npu)}
    assert ops["torch_npu.npu_rms_norm"] is True  # on every line, from torch_npu 2.1.0
    assert ops["torch_npu.npu_add_rms_norm"] is ("npu_add_rms_norm" in fake_torch_npu.LINE.OPS)
    assert ops["torch_npu.npu_fusion_attention"] is False  # not faked


def test_vermin_finds_nothing_newer_than_python_39():
    """helpers/, tests/ and scripts/ must run on the support floor, Python 3.9."""
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    if not Path(vermin).exists():
        pytest.fail("vermin is not installed; it is pinned in requirements-common.txt")
    # -t=3.9- : fail (exit 1) when any file needs more than 3.9; --violations lists only those.
    # --eval-annotations and --feature union-types catch PEP 604 uses outside `from __future__`.
    proc = subprocess.run([vermin, "-t=3.9-", "--no-tips", "--violations", "--eval-annotations",
                           "--backport", "typing", "--backport", "dataclasses", "helpers", "tests",
                           "scripts"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vermin_would_catch_a_newer_construct(tmp_path):
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    bad = tmp_path / "new.py"
    bad.write_text("import zoneinfo\nprint(zoneinfo)\n")  # zoneinfo is Python 3.9+: passes
    ok = subprocess.run([vermin, "-t=3.9-", "--no-tips", "--violations", str(bad)],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout
    bad.write_text("def f(x):\n    match x:\n        case 1:\n            return 1\n")  # 3.10+
    proc = subprocess.run([vermin, "-t=3.9-", "--no-tips", "--violations", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0


def test_version_tuple_drops_local_and_post_parts():
    assert versions.version_tuple("2.1.0.post10") == (2, 1, 0)
    assert versions.version_tuple("2.13.0+cpu") == (2, 13, 0)
    assert versions.version_tuple("5.24.0.dev0") == (5, 24, 0) and versions.version_tuple("2.5") == (2, 5, 0)
