"""The chapter preamble: parameters checked by name, device and dtype picked, results opened."""
import json

import pytest

from helpers import chapter, params

NOTEBOOKS = sorted(p.stem for p in (chapter.REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_notebook_parameter_has_a_check(name):
    missing = [p for p in chapter.parameter_names(name) if p not in params.CHECKS]
    assert not missing, f"{name}: parameters without a rule in helpers.params.CHECKS: {missing}"


def test_open_chapter_checks_by_name_and_records_the_choice(tmp_path):
    namespace = {"device": "cpu", "model": "tiny-random", "dtype": "float32", "rms_shape": [1, 8, 16],
                 "prefill_tokens": 4, "compile_ops": False, "llama7b_edge_ops": False, "min_iters": 2,
                 "min_seconds": 0.0, "run_dir": str(tmp_path), "profile": "test", "unrelated": object()}
    ch = chapter.open_chapter("01_operator_verification", namespace)
    assert ch.DEV == "cpu" and ch.DT == "float32" and ch.dtype_reason == "set by the dtype parameter"
    saved = json.loads(ch.results.path.read_text())
    assert saved["parameters"]["rms_shape"] == [1, 8, 16] and "unrelated" not in saved["parameters"]
    assert saved["device_choice"]["dtype"] == "float32" and "run_dir" not in saved["parameters"]
    with pytest.raises(ValueError, match=r"rms_shape=\[1, 8\] is not valid; give 3 integers"):
        chapter.open_chapter("01_operator_verification", {**namespace, "rms_shape": [1, 8]})
    with pytest.raises(ValueError, match="min_iters=0 is not valid"):
        chapter.open_chapter("01_operator_verification", {**namespace, "min_iters": 0})
    with pytest.raises(ValueError, match=r"no check for parameter\(s\) \['speed'\]"):
        chapter.open_chapter("01_operator_verification", namespace, speed=3)


def test_dtype_auto_takes_chapter_00s_recorded_choice(tmp_path, monkeypatch):
    import torch

    from helpers import backend, dtype_choice
    from helpers.results import Results

    monkeypatch.delenv(dtype_choice.RUN_DIR_ENV, raising=False)
    # a recorded choice no probe on this machine would make for a float32-only reason text
    Results("00_environment_check", tmp_path).record(
        dtype_choice.DTYPE_CHOICE_KEY, "bfloat16", reason="bfloat16: recorded here", decision="16bit_faster", rows=[],
        cpu_capability=backend.cpu_capability(), threads=torch.get_num_threads())
    namespace = {"device": "cpu", "model": "tiny-random", "dtype": "auto", "rms_shape": [1, 8, 16],
                 "prefill_tokens": 4, "compile_ops": False, "llama7b_edge_ops": False, "min_iters": 2,
                 "min_seconds": 0.0, "run_dir": str(tmp_path), "profile": "test"}
    ch = chapter.open_chapter("01_operator_verification", namespace)
    assert ch.DT == "bfloat16" and ch.dtype_reason == "bfloat16: recorded here"
    saved = json.loads(ch.results.path.read_text())["device_choice"]
    assert saved["dtype"] == "bfloat16" and saved["dtype_source"] == "recorded by chapter 00 of this run"
    assert dtype_choice.parse_dtype("auto", "cpu", run_dir=tmp_path) == ch.dtype  # chapters 05 and 06's path


def test_chapter_00_measures_dtype_auto_instead_of_reading_an_old_record(tmp_path, monkeypatch):
    import torch

    from helpers import backend, dtype_choice
    from helpers.results import Results

    monkeypatch.delenv(dtype_choice.RUN_DIR_ENV, raising=False)
    Results("00_environment_check", tmp_path).record(
        dtype_choice.DTYPE_CHOICE_KEY, "bfloat16", reason="bfloat16: an old record", decision="16bit_faster", rows=[],
        cpu_capability=backend.cpu_capability(), threads=torch.get_num_threads())
    fresh = dtype_choice.DtypeChoice(torch.float32, "float32: measured now", "measured now",
                                     rows=[{"dtype": "float32", "decode_ms": 1.0}], decision="float32_not_slower",
                                     cpu_capability=backend.cpu_capability(), threads=torch.get_num_threads())
    monkeypatch.setattr(dtype_choice, "measure_cpu_dtype", lambda *a, **k: fresh)
    namespace = {"device": "cpu", "model": "smollm2-135m", "dtype": "auto", "max_new_tokens": 2,
                 "bandwidth_mib": 1, "lang": "en", "run_dir": str(tmp_path), "profile": "test"}
    ch = chapter.open_chapter("00_environment_check", namespace)
    assert ch.DT == "float32" and ch.dtype_choice is fresh and ch.dtype_reason == "float32: measured now"
    ch.record(dtype_choice.DTYPE_CHOICE_KEY, ch.DT, **fresh.record())
    monkeypatch.setattr(dtype_choice, "measure_cpu_dtype", lambda *a, **k: pytest.fail("measured again"))
    other = chapter.open_chapter("01_operator_verification", {
        "device": "cpu", "model": "tiny-random", "dtype": "auto", "rms_shape": [1, 8, 16], "prefill_tokens": 4,
        "compile_ops": False, "llama7b_edge_ops": False, "min_iters": 2, "min_seconds": 0.0,
        "run_dir": str(tmp_path), "profile": "test"})
    assert other.DT == "float32" and other.dtype_choice.source == "recorded by chapter 00 of this run"
    fixed = chapter.open_chapter("00_environment_check", {**namespace, "dtype": "float32"})
    assert fixed.dtype_choice is None and fixed.dtype_reason == "set by the dtype parameter"


@pytest.mark.parametrize("lang, words", [("en", ("**device**", "**dtype**", "**warning:**")),
                                         ("zh", ("**设备**", "**数据类型**", "**警告：**"))])
def test_the_preamble_line_names_its_parts_in_the_edition_s_language(monkeypatch, capsys, lang, words):
    import builtins

    import torch

    real_import = builtins.__import__

    def no_ipython(name, *args, **kwargs):  # the line as a plain Python session prints it
        if name.startswith("IPython"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ipython)
    ch = chapter.Chapter("01_operator_verification", torch.device("cpu"), "requested cpu", torch.float32,
                         "requested float32", None, {}, lang)
    # a machine under load and an unseen CPU class: both warnings, in the reader's words
    chapter._show_choice(ch, "load average 2.5", unseen="an unseen CPU")
    out = capsys.readouterr().out
    assert all(w in out for w in words) and out.count(words[2]) == 2 and "load average 2.5" in out
