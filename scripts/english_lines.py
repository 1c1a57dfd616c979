"""How much of what a Chinese reader sees at run time is English only: the output lines of the executed
notebooks of a run folder (``reports/<run-id>/<chapter>.ipynb``, answers included), each line judged
on its own:

    python scripts/english_lines.py reports/<run-id>            # the share per notebook and in all
    python scripts/english_lines.py reports/<run-id> --lines    # ... and every English-only line

A line is English only when it has no Han character and three or more English words. Not words:
inline code and links, identifiers and numbers (anything with a digit, an underscore, a dot or a
slash inside: ``rms_norm``, ``1x256x2048``, ``GB/s``, ``float32``), single letters (``H=576``), command-line options (``--model``), names
with a capital after the first letter (``TTFT``, ``EPYC``, ``SmolLM``), and the names and units of
``ALLOWED``, the one list of what stays English in a Chinese page (TERMINOLOGY.md keeps these
terms); and a line whose English words all come from the model's own text (``MODEL_TEXT``: the
prompts and answers a chapter recorded). An output line is a line of a code cell's output as the
page shows it: printed text, a Markdown display (the chapters' summaries), a table's text; a
figure's text is inside its image and is not read here. ``tests/test_english_lines.py`` fails above ``LIMIT`` over the Chinese run of `make test` (every chapter and answer).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

LIMIT = 0.02  # the most English-only output lines a Chinese run may show, as a share of all of them

# Names, units and terms a Chinese page writes in English (TERMINOLOGY.md: API names, dtype names,
# units and a few terms are never translated). Compared lower-case; identifiers with a digit, an
# underscore, a dot or a slash are excepted without being listed.
ALLOWED = frozenset("""
    llama smollm smollm2 instruct hf meta qwen mistral nousresearch
    ascend huawei modelarts cann torch_npu npu gpu cpu cuda nvidia intel amd arm aarch64 x86 avx amx
    neon sve hbm dram ddr
    pytorch torch torchair inductor aten dynamo triton vllm llama.cpp ggml gguf transformers
    huggingface hub mindie mindspeed atb aclnn acl ge openai numpy pandas matplotlib python jupyter
    jupyterlab papermill babel
    ms us ns s kb mb gb tb kib mib gib tib flops gflops tflops tokens token tok bytes gb/s
    fp32 fp16 bf16 float32 float16 bfloat16 int8 int4 w8a16 w8a8 w4a16 fp8
    kv cache batch eager shape shapes prefill decode ttft tpot itl rmsnorm swiglu silu rope mlp ffn
    gemm gemv matmul lm_head softmax top-1 p10 p50 p90 p99 sdpa qkv rms norm
    profile quick default smoke interactive auto
    true false none nan inf ok x
""".split())

# The model's own text is data in the model's language, not the workbook's words: the prompts the
# chapters send and what the model answered, as each chapter recorded them (results.json). A line
# whose English words all come from that text is quoted model text and is not counted.
MODEL_TEXT = {"metrics": ("smoke_generation", "request_answer"), "tables": ("answers",),
              "fields": ("prompt", "answer", "alone", "batched")}

HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
WORD = re.compile(r"[A-Za-z]+(?:['\u2019-][A-Za-z]+)*")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# a fenced code block in a Markdown output (a listing of the workbook's code, chapter 06's decode loop):
# code, like inline code, not prose
FENCED = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.S | re.M)
# what is not prose: inline code, a link's target, a bare URL, an HTML tag
NOT_PROSE = re.compile(r"`[^`]*`|\]\([^)]*\)|https?://\S+|<[^>]+>")
# a token is what lies between spaces and the punctuation that separates words (the separators of a
# table, brackets, quotes); a token with a digit, an underscore, a dot, a slash or a colon inside it is
# an identifier, a number or a unit
SEPARATORS = re.compile(r"[\s|,;()\[\]{}<>=*\"“”‘’«»!?]+")
EDGES = ".:'\u2019-"
# a capital after the first letter: an acronym or a name (EPYC, TTFT, SmolLM, BitsAndBytesConfig)
NAME = re.compile(r"^.+[A-Z]")


def english_words(line: str) -> list[str]:
    """The English words of a line that are neither identifiers nor in ``ALLOWED``."""
    words = []
    for token in SEPARATORS.split(NOT_PROSE.sub(" ", ANSI.sub("", line))):
        if token.startswith("-") and token.strip("-"):
            continue  # a command-line option: -m, --model, --use-flash-attn
        if token.endswith(("...", "\u2026")):
            continue  # a word a table cut short ("atmospher..."): no word of its own
        token = token.strip(EDGES)
        if (len(token) > 1 and WORD.fullmatch(token) and token.lower() not in ALLOWED
                and not NAME.search(token)):
            words.append(token)
    return words


def is_english_only(line: str, model_words: frozenset = frozenset()) -> bool:
    """No Han character and three or more English words (names, units and identifiers excepted),
    not all of them words of the model's own text (``model_words``)."""
    if HAN.search(line):
        return False
    words = english_words(line)
    return len(words) >= 3 and not all(w.lower() in model_words for w in words)


def model_words(run_dir: Path) -> frozenset:
    """The words of the model's own text recorded in a run folder (``MODEL_TEXT``), lower-case."""
    texts = []

    def walk(value, key=None):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and key in MODEL_TEXT["fields"]:
            texts.append(value)

    for path in sorted(Path(run_dir).glob("*/results.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for name in MODEL_TEXT["metrics"]:
            entry = (data.get("metrics") or {}).get(name) or {}
            texts += [str(entry.get("value", "")), str(entry.get("prompt", ""))]
        for name in MODEL_TEXT["tables"]:
            for row in (data.get("tables") or {}).get(name) or []:
                texts += [str(k) for k in row] + [str(v) for v in row.values()]
        walk(data)
    return frozenset(w.lower() for text in texts for w in WORD.findall(text))


def output_lines(notebook: dict) -> list[str]:
    """The non-blank lines a reader sees below the code cells of an executed notebook: printed
    text, Markdown (or else plain text) of every display and result without an image, and errors;
    a fenced code block of a Markdown output is code, not a line a translation could change."""
    lines = []
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream":
                text = _text(out.get("text", ""))
            elif kind == "error":
                text = "\n".join([f"{out.get('ename', '')}: {out.get('evalue', '')}", *out.get("traceback", [])])
            else:
                data = out.get("data", {})
                if any(mime.startswith("image/") for mime in data):
                    continue  # a figure: its words are drawn in the image
                markdown = data.get("text/markdown")
                if markdown is not None:
                    text = FENCED.sub("", _text(markdown))
                else:
                    text = _text(data.get("text/plain", ""))
            lines += [line for line in ANSI.sub("", text).splitlines() if line.strip()]
    return lines


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


@dataclass
class Count:
    """English-only lines of one notebook (or of a run: ``total``)."""

    name: str
    lines: int = 0
    english: list = field(default_factory=list)

    @property
    def share(self) -> float:
        return len(self.english) / self.lines if self.lines else 0.0


def count_notebook(path: Path, model: frozenset = frozenset()) -> Count:
    lines = output_lines(json.loads(path.read_text(encoding="utf-8")))
    return Count(path.stem, len(lines), [line for line in lines if is_english_only(line, model)])


def count_run(run_dir: Path) -> tuple[Count, list[Count]]:
    """``(total, per notebook)`` over every executed notebook of a run folder. A folder without
    executed notebooks is an error: a check over nothing would pass."""
    run_dir = Path(run_dir)
    notebooks = sorted(run_dir.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"{run_dir}: no executed notebook (<chapter>.ipynb) in this run folder")
    model = model_words(run_dir)
    counts = [count_notebook(path, model) for path in notebooks]
    total = Count("all", sum(c.lines for c in counts), [line for c in counts for line in c.english])
    return total, counts


def report(run_dir: Path, show_lines: bool = False) -> str:
    total, counts = count_run(run_dir)
    rows = [f"{c.name:45} {len(c.english):4} / {c.lines:4}  {100 * c.share:5.1f} %" for c in counts + [total]]
    if show_lines:
        rows += [f"{c.name}: {line.strip()[:160]}" for c in counts for line in c.english]
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--lines", action="store_true", help="list every English-only line")
    args = parser.parse_args(argv)
    print(report(args.run_dir, args.lines))
    total, _ = count_run(args.run_dir)
    return 0 if total.share <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
