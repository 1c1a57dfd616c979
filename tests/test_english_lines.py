"""What a Chinese reader sees at run time is Chinese: at most ``english_lines.LIMIT`` (2 %) of the output
lines of the Chinese run's notebooks and answers are English only (scripts/english_lines.py:
three or more English words and no Han character; names, units and identifiers excepted, the
allowance in ``english_lines.ALLOWED``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import english_lines  # noqa: E402


@pytest.mark.parametrize("line", [
    "The chapter itself ran on **cpu** because *auto: no NPU or CUDA device found*",
    "impl          layout  median_ms  p10_ms  p90_ms  noisy  first_call_s",
    "0  run's shape 1x256x2048 (the guide's is 1x4096x...  reference   0.538620",
    "- **torch_npu：** torch_npu not installed: nothing to pair；",  # full-width punctuation is no Chinese
])
def test_an_english_line_is_found(line):
    assert english_lines.is_english_only(line), english_lines.english_words(line)


@pytest.mark.parametrize("line", [
    "本章在 **cpu** 上运行，因为 auto: no NPU or CUDA device found",  # one Han character is enough
    "0  reference  contiguous  2.149  0.534  2.976  True  0.002",  # two words: below three
    "name  SmolLM2  LlamaForCausalLM  TTFT  EPYC",  # names and acronyms
    "`torch_npu.npu_rms_norm(x, gamma, epsilon)` 1x256x2048 GB/s float32 bfloat16 ms tokens/s",
    "0    large H=1024 I=2816, T=1    unfused   1.689",  # single letters are variables, not words
    "decode prefill batch KV cache TTFT",  # terms the Chinese edition keeps (TERMINOLOGY.md)
    "#    --use-flash-attn --use-fused-swiglu --use-fused-rmsnorm --fp16",  # command-line options
    "运行 `python -m helpers.run --profile quick --only 03` 与 [指南](https://example.com/the-long-path)",
    "`python -m helpers.run --only 03 a long command` [x](https://example.com/a-long-english-path-here)",
])
def test_names_units_identifiers_and_chinese_lines_are_not_counted(line):
    assert not english_lines.is_english_only(line), english_lines.english_words(line)


def _notebook(tmp_path: Path, name: str, outputs: list) -> Path:
    cells = [{"cell_type": "markdown", "source": "An English markdown cell is not output.", "metadata": {}},
             {"cell_type": "code", "source": "x", "metadata": {}, "outputs": outputs, "execution_count": 1}]
    path = tmp_path / f"{name}.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_output_lines_are_what_the_page_shows(tmp_path):
    path = _notebook(tmp_path, "a", [
        {"output_type": "stream", "name": "stdout", "text": ["printed in English for a reader\n", "\n"]},
        {"output_type": "display_data", "metadata": {},
         "data": {"text/markdown": "本段是中文。\n\nthen an English paragraph follows", "text/plain": "<Markdown>"}},
        {"output_type": "execute_result", "metadata": {}, "execution_count": 1,
         "data": {"text/plain": "   name  value\n0  cpu  1", "text/html": "<table></table>"}},
        {"output_type": "display_data", "metadata": {},
         "data": {"image/png": "iVBOR", "text/plain": "<Figure size 640x480 with 1 Axes>"}},
        {"output_type": "display_data", "metadata": {},  # a listing of code: code, not prose
         "data": {"text/markdown": "```python\nfor step in range(n):  # one forward for every new token\n```\n",
                  "text/plain": "<Markdown>"}},
    ])
    lines = english_lines.output_lines(json.loads(path.read_text()))
    assert lines == ["printed in English for a reader", "本段是中文。", "then an English paragraph follows",
                     "   name  value", "0  cpu  1"]
    count = english_lines.count_notebook(path)
    assert count.english == ["printed in English for a reader", "then an English paragraph follows"]
    assert count.share == pytest.approx(2 / 5)


def test_the_check_fails_on_an_english_run_folder_and_passes_on_a_chinese_one(tmp_path):
    english = tmp_path / "en"
    english.mkdir()
    _notebook(english, "01_x", [{"output_type": "stream", "name": "stdout",
                                 "text": "the whole request grows with the number of new tokens\n"}])
    assert english_lines.main([str(english)]) == 1
    chinese = tmp_path / "zh"
    chinese.mkdir()
    _notebook(chinese, "01_x", [{"output_type": "stream", "name": "stdout", "text": "整个请求随新 token 数增长\n"}])
    assert english_lines.main([str(chinese)]) == 0
    with pytest.raises(FileNotFoundError, match="no executed notebook"):
        english_lines.count_run(tmp_path / "empty")


def test_the_model_s_own_text_is_not_counted(tmp_path):
    (tmp_path / "05_x").mkdir()
    (tmp_path / "05_x" / "results.json").write_text(json.dumps({
        "metrics": {"smoke_generation": {"value": "The capital of France is Paris.", "prompt": "Name it."}},
        "tables": {"answers": [{"variant": "dense", "Write one sentence about the sea.": "The night sky is blue"}]}}))
    path = _notebook(tmp_path, "05_x", [{"output_type": "stream", "name": "stdout", "text": [
        "dense  The capital of France is Paris.\n", "Write one sentence about the sea.\n",
        "the night sky is a decode of the bandwidth here\n"]}])
    words = english_lines.model_words(tmp_path)
    assert english_lines.count_notebook(path, words).english == ["the night sky is a decode of the bandwidth here"]
    assert len(english_lines.count_notebook(path).english) == 3  # without the run's model text
    # a table cuts a long answer short: the cut word is no word of the model's text, nor any other
    assert not english_lines.is_english_only("w8a16  The capital of France is Par...", words)
    assert english_lines.is_english_only("w8a16  The capital of France is Par...", frozenset())


@pytest.mark.notebooks
def test_the_chinese_run_shows_at_most_two_percent_english_only_lines(zh_run):
    run_dir = zh_run["run_dir"]
    assert run_dir.is_dir(), zh_run["proc"].stdout[-3000:] + zh_run["proc"].stderr[-3000:]
    total, counts = english_lines.count_run(run_dir)
    assert total.share <= english_lines.LIMIT, (
        f"{len(total.english)} of {total.lines} output lines ({100 * total.share:.1f} %) are English only, "
        f"above {100 * english_lines.LIMIT:.0f} %:\n" + english_lines.report(run_dir, show_lines=True))
