"""The Chinese docs pages (docs/zh/X.md) keep in step with their English pages (docs/X.md).

Every English page has a Chinese one, except the pages of ``PENDING``; every Chinese page has an
English one. For each pair, read with mistune as tests/test_docs_commands.py reads the docs:

- the headings: the same sequence of levels (so the same number of sections per level, in order);
- the shell commands: the commands of the ```bash / sh blocks, comments dropped (a comment may be
  translated), one per line with its continuations joined, as the shell's tokens: identical and in
  the same order, except that a Chinese page's command that runs the chapters (``make report``,
  ``python -m helpers.run``) names the Chinese edition (``LANG=zh``, ``--lang zh``), which every such
  command of a Chinese page (README.zh.md too) must do: a Chinese reader gets Chinese reports;
- the figures: the multiset of numbers written in the prose, the headings, the tables and the
  inline code of each page is the same. Code blocks are left out (their commands are the check
  above, their comments are translated), and so are link targets (URLs, paths, anchors); a link's
  text counts. A number is a run of ASCII digits with its decimal part (``1.5``) and further dotted
  parts (``2.1.0``) kept as written, and thousands separators dropped (``1,343`` is ``1343``; a
  comma counts as one only before exactly three digits, so ``[1,2,4]`` is three numbers). Numbers
  inside words count too (``Llama-2-7B`` is 2 and 7, ``float16`` is 16, ``p95`` is 95), so a
  figure the Chinese page drops, changes, adds, or writes in Chinese numerals (十, 两) or in
  full-width digits fails. One label is no figure: ``p10–p90`` (or ``p10-p90``), the name of the
  spread, which TERMINOLOGY.md translates as “p10–p90 区间” also where the English says only
  "spread". No other normalisation: ``00`` is not ``0``, ``0.50`` is not ``0.5``;
- the header: the first paragraph after the title of the Chinese page links to ``../X.md``, that
  of the English page to ``zh/X.md``.

Each failure names the page and what differs.
"""
from __future__ import annotations

import difflib
import re
import shlex
from collections import Counter
from pathlib import Path

import mistune
import pytest

from test_docs_commands import SHELL, code_blocks

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
ZH = DOCS / "zh"

# English pages without a Chinese one yet: translated once their English is settled
PENDING: set[str] = set()

NUMBER = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)*(?![0-9])|[0-9]+(?:\.[0-9]+)*")
SPREAD_LABEL = re.compile(r"(?<![A-Za-z0-9])p10\s*[-–]\s*p90(?![0-9])")
_PARSE = mistune.create_markdown(renderer=None)


def _tokens(text: str) -> list[dict]:
    return _PARSE(text)


def _walk(tokens):
    for token in tokens:
        yield token
        yield from _walk(token.get("children") or [])


def heading_levels(text: str) -> list[int]:
    return [t["attrs"]["level"] for t in _walk(_tokens(text)) if t["type"] == "heading"]


def shell_commands(text: str) -> list[str]:
    """The command lines of the shell blocks, comments dropped, as ``shlex.join`` of their tokens."""
    found = []
    for info, code in code_blocks(text):
        if info.split(" ")[0] not in SHELL:
            continue
        for line in code.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens = list(lexer)
            if tokens:
                found.append(shlex.join(tokens))
    return found


def _inline_text(token: dict) -> str:
    """The words a reader sees in an inline token: a link's text without its target, code spans
    as written; pieces are spaced apart so that no two numbers run into one."""
    kind = token["type"]
    if kind in ("text", "codespan", "inline_html"):
        return token.get("raw", "")
    if kind in ("softbreak", "linebreak"):
        return " "
    return " " + "".join(_inline_text(child) for child in token.get("children") or []) + " "


def prose(text: str) -> str:
    """The page without its code blocks and link targets: one line per block."""
    lines = []

    def visit(tokens):
        for token in tokens:
            if token["type"] in ("block_code", "blank_line", "thematic_break"):
                continue
            if token["type"] == "block_html":
                lines.append(token.get("raw", ""))
            elif token["type"] in ("paragraph", "heading", "block_text"):
                lines.append("".join(_inline_text(child) for child in token.get("children") or []))
            else:
                visit(token.get("children") or [])

    visit(_tokens(text))
    return "\n".join(lines)


def figures(text: str) -> Counter:
    """The multiset of numbers of a page's prose (see the module docstring for the rule)."""
    return Counter(match.replace(",", "") for match in NUMBER.findall(SPREAD_LABEL.sub(" ", prose(text))))


def _occurrences(text: str) -> list[tuple[str, str]]:
    """``(number, the prose around it)`` for every figure of a page, in order."""
    page = SPREAD_LABEL.sub(" ", prose(text))
    return [(m.group().replace(",", ""), page[max(0, m.start() - 30):m.end() + 30].replace("\n", " "))
            for m in NUMBER.finditer(page)]


def figure_differences(english: str, chinese: str) -> list[str]:
    """One line per number whose count differs. The places shown are the occurrences the two
    pages' figure sequences do not align on (difflib), which is where a figure was dropped,
    changed or added, unless the translation moved it."""
    en, zh = figures(english), figures(chinese)
    en_seq, zh_seq = _occurrences(english), _occurrences(chinese)
    unaligned_en, unaligned_zh = [], []
    matcher = difflib.SequenceMatcher(None, [n for n, _ in en_seq], [n for n, _ in zh_seq], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            unaligned_en += en_seq[i1:i2]
            unaligned_zh += zh_seq[j1:j2]

    def where(number, unaligned, sequence):
        found = [around for n, around in unaligned if n == number] or \
            [around for n, around in sequence if n == number]
        return found[:3]

    return [f"{number}: ×{en[number]} in the English page {where(number, unaligned_en, en_seq)}, "
            f"×{zh[number]} in the Chinese page {where(number, unaligned_zh, zh_seq)}"
            for number in sorted(set(en) | set(zh)) if en[number] != zh[number]]


def _header_links(text: str) -> list[str]:
    """The link targets of the first paragraph after the title (the page's navigation line)."""
    tokens = [t for t in _tokens(text) if t["type"] != "blank_line"]
    paragraph = next((t for t in tokens[1:] if t["type"] == "paragraph"), {"children": []})
    return [t["attrs"]["url"] for t in _walk(paragraph["children"]) if t["type"] == "link"]


def _pairs() -> list[str]:
    return sorted(path.name for path in ZH.glob("*.md") if (DOCS / path.name).exists())


PAIRS = _pairs()


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_every_page_has_both_editions():
    english = {path.name for path in DOCS.glob("*.md")}
    chinese = {path.name for path in ZH.glob("*.md")}
    assert not PENDING - english, f"PENDING names pages docs/ does not have: {sorted(PENDING - english)}"
    missing = sorted(english - chinese - PENDING)
    assert not missing, f"English pages without a Chinese page in docs/zh/: {missing} (translate them, " \
                        "or add them to PENDING)"
    orphans = sorted(chinese - english)
    assert not orphans, f"Chinese pages without an English page in docs/: {orphans}"
    assert {"ascend.md", "glossary.md", "troubleshooting.md"} <= set(PAIRS)


@pytest.mark.parametrize("page", PAIRS)
def test_the_same_headings(page):
    en, zh = heading_levels(_read(DOCS / page)), heading_levels(_read(ZH / page))
    assert en, f"docs/{page}: no heading found: is the reader broken?"
    assert en == zh, (f"docs/zh/{page}: heading levels {zh} differ from docs/{page}'s {en} "
                      f"(count per level: English {dict(Counter(en))}, Chinese {dict(Counter(zh))})")


EDITION_TOKENS = ("LANG=zh", "--lang zh")


def runs_chapters(command: str) -> bool:
    return (bool(re.search(r"\bmake\b.*\breport\b|-m helpers\.run\b", command))
            and not any(flag in command.split() for flag in ("--help", "--list")))


def without_edition(command: str) -> str:
    for token in EDITION_TOKENS:
        command = command.replace(" " + token, "")
    return command


@pytest.mark.parametrize("page", [*PAIRS, "../../README.zh.md"])
def test_a_chinese_page_runs_the_chinese_edition(page):
    english_only = [c for c in shell_commands(_read(ZH / page)) if runs_chapters(c)
                    and not any(t in c for t in EDITION_TOKENS)]
    assert not english_only, (f"docs/zh/{page}: these commands would write English reports; add LANG=zh "
                              f"(make) or --lang zh (the runner): {english_only}")


@pytest.mark.parametrize("page", PAIRS)
def test_the_same_commands(page):
    en, zh = ([without_edition(c) if runs_chapters(c) else c for c in shell_commands(_read(folder / page))]
              for folder in (DOCS, ZH))
    assert en == zh, f"docs/zh/{page}: shell commands differ from docs/{page}'s:\n" + "\n".join(
        difflib.unified_diff(en, zh, f"docs/{page}", f"docs/zh/{page}", lineterm=""))


@pytest.mark.parametrize("page", PAIRS)
def test_the_same_figures(page):
    problems = figure_differences(_read(DOCS / page), _read(ZH / page))
    assert not problems, f"docs/zh/{page}: figures differ from docs/{page}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAIRS)
def test_each_edition_links_to_the_other(page):
    zh_links = [url.split("#")[0] for url in _header_links(_read(ZH / page))]
    en_links = [url.split("#")[0] for url in _header_links(_read(DOCS / page))]
    assert f"../{page}" in zh_links, f"docs/zh/{page}: its header does not link to ../{page}: {zh_links}"
    assert f"zh/{page}" in en_links, f"docs/{page}: its header does not link to zh/{page}: {en_links}"


def test_the_figures_check_finds_a_dropped_changed_or_spelt_out_figure():
    english = _read(DOCS / "glossary.md")
    chinese = _read(ZH / "glossary.md")
    assert figures(english)["95"] >= 1 and not figure_differences(english, chinese)
    altered = chinese.replace("95 %", "90 %", 1)
    assert altered != chinese
    problems = figure_differences(english, altered)
    n90, n95 = figures(english)["90"], figures(english)["95"]
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"90: ×{n90} in the English page") and "至少 90 %" in problems[0], problems
    assert f"×{n90 + 1} in the Chinese page" in problems[0], problems
    assert problems[1].startswith(f"95: ×{n95} in the English page"), problems
    assert f"×{n95 - 1} in the Chinese page" in problems[1], problems
    assert figure_differences("It took 1,343 ms (Llama-2-7B).", "耗时 1343 ms（Llama-2-7B）。") == []
    assert figure_differences("2 layers, 32 heads", "两层，32 个头") == [
        "2: ×1 in the English page ['2 layers, 32 heads'], ×0 in the Chinese page []"]
    assert figure_differences("2 layers", "２ 层")  # a full-width digit is no figure
    assert figure_differences("0.5x", "0.50x")
    # code blocks and link targets are left out; a link's text and inline code count
    assert figures("See [chapter 03](a/b04.md#x5).\n\n```bash\nmake report  # 7\n```\n`-p x=[1,2,4]`") == \
        Counter({"03": 1, "1": 1, "2": 1, "4": 1})
    assert figures("| 1,228 | 2.1.0.post6 |") == Counter({"1228": 1, "2.1.0": 1, "6": 1})
    assert figures("the spread, p10-p90 1.38–1.92; p95") == figures("p10–p90 区间 1.38–1.92；p95")


def test_the_command_reader_drops_comments_only():
    code = "```bash\nmake report LANG=zh   # or EDITION=zh\nWORKBOOK_CACHE=/x make lab \\\n  --x  # 注释\n```\n"
    assert shell_commands(code) == ["make report LANG=zh", "WORKBOOK_CACHE=/x make lab --x"]
    assert shell_commands("```python\nimport x\n```\n") == []
