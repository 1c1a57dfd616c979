"""One terminology in the Chinese edition (TERMINOLOGY.md): the rejected variants of a term are
found in no Chinese file a reader sees: the chapter templates' catalogs, the words / labels tables,
the markdown of the Chinese notebooks and worked answers, README.zh.md and the pages of docs/zh/."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from babel.messages import pofile

REPO = Path(__file__).resolve().parent.parent

# rule -> (pattern of the rejected variant, what TERMINOLOGY.md says to write instead)
RULES = {
    "spread": (r"离散范围|波动范围", "the spread is “p10–p90 区间”"),
    "latency": (r"延迟", "latency is 时延"),
    "tok/s": (r"(?<![\w/])tok/s", "the unit is tokens/s"),
    "nested brackets": (r"（[^（）\n]*（", "no bracket inside a bracket: a decision word carries none"),
    "bare kernel": (r"(?<!内核 \()(?<!Jupyter )\bkernels?\b", "an operator's kernel is 算子内核 / 内核 (kernel); "
                    "the Jupyter kernel is “Jupyter 内核”"),
    "A 对 B": (r"(?:\d\s?[A-Za-z%]*|`)\s对\s(?:\d|`)", "“A 与 B 相比” / “A 比 B”, not the calque “A 对 B”"),
    "地更快": (r"超出噪声地|范围地更快", "say the direction, then that it is beyond the noise"),
}
# a decision word (the runtime catalog's msgctxt "decision") is put inside sentences and brackets: it
# holds no bracket itself
DECISION_BRACKET = re.compile(r"[（(]")
DECISION_WORDS = "decision words (runtime.po, msgctxt decision)"


def _code_free(text: str) -> str:
    """Prose without code: fenced blocks and inline code spans hold identifiers, not terms."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", " ", text)


def chinese_files() -> dict:
    """``{relative path: prose text}`` of every Chinese file a reader sees."""
    files = {}
    decisions = []
    # a chapter's block quotes are the guide's own words, quoted as written (TERMINOLOGY.md); the worked
    # answers' quotes are the exercises, which follow the terms
    chapter_cells = {"".join(c["source"]) for path in (REPO / "notebooks").glob("*.ipynb")
                     for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "markdown"}
    for path in sorted((REPO / "helpers" / "locale" / "zh").rglob("*.po")):
        with open(path, "rb") as handle:
            entries = [m for m in pofile.read_po(handle) if m.id]
        # a placeholder's name (%(kernels)s) is an identifier, not a term
        files[path] = "\n\n".join(re.sub(r"^>.*$", " ", m.string, flags=re.M) if m.id in chapter_cells
                                   else re.sub(r"%\(\w+\)s", " ", m.string) for m in entries)
        decisions += [m.string for m in entries if m.context == "decision"]
    # the Chinese README and docs pages (a ModelArts user's setup and troubleshooting)
    for path in [REPO / "README.zh.md", *sorted((REPO / "docs" / "zh").glob("*.md"))]:
        if path.exists():
            files[path] = path.read_text(encoding="utf-8")
    assert decisions, "the runtime catalog holds no decision words (msgctxt decision)"
    return {**{str(p.relative_to(REPO)): _code_free(text) for p, text in files.items()},
            DECISION_WORDS: "\n".join(decisions)}


def found_rules(name: str, text: str) -> dict:
    hits = {rule: re.findall(pattern, text) for rule, (pattern, _) in RULES.items()}
    if name == DECISION_WORDS:
        hits["bracket in a decision word"] = DECISION_BRACKET.findall(text)
    return {rule: h for rule, h in hits.items() if h}


FILES = chinese_files()


@pytest.mark.parametrize("name", sorted(FILES))
def test_no_rejected_variant_of_a_term(name):
    # no allowance: every file a Chinese reader sees follows the terms (the guides' own words are
    # quoted as block quotes, which are left out above)
    broken = found_rules(name, FILES[name])
    assert not broken, f"{name}: " + "; ".join(
        f"{rule} {hits[:3]} ({RULES[rule][1] if rule in RULES else 'write the word without brackets'})"
        for rule, hits in broken.items())


def test_each_rule_finds_its_variant():
    samples = {"spread": "加速比（离散范围 1.38–1.92）", "latency": "首 token 延迟", "tok/s": "解码 tok/s",
               "nested brackets": "1.56x（区间 1.38–1.92：更快（超出噪声））", "bare kernel": "矩阵乘 kernel",
               "A 对 B": "249 MB 对 538 MB", "地更快": "超出噪声地更快"}
    for rule, sample in samples.items():
        assert rule in found_rules("x.ipynb", sample), rule
    assert not found_rules("x.ipynb", "算子内核 (kernel)、Jupyter kernel、tokens/s、p10–p90 区间、时延、`A 对 B`")
    assert "bracket in a decision word" in found_rules(DECISION_WORDS, "更快（超出噪声）")
