"""Templates render only recorded figures, with direction words from helpers.decide."""
import re

import pytest

from helpers import prose

RESULTS = {"chapter": "99_demo", "parameters": {"repeats": 5},
           "metrics": {"speedup": {"value": 1.05, "unit": "x", "low": 0.91, "high": 1.23, "dtype": "float32"},
                       "ttft_ms": {"value": 83.456, "unit": "ms"}},
           "tables": {"rows": [{"path": "eager", "step_ms": 45.5}, {"path": "graph", "step_ms": 26.5}]}}
TEMPLATE = """{% block summary %}
The change is {{ m.speedup | fig }} ({{ direction(m.speedup.low, m.speedup.high) }}) in {{ m.speedup.dtype | text }};
TTFT {{ m.ttft_ms | fig }}. {% for r in t.rows %}{{ r.path | text }}: {{ r.step_ms | num }} ms. {% endfor %}
{% endblock %}
{% block computes %}{{ m.ttft_ms.value * 2 }}{% endblock %}
"""


@pytest.fixture
def templates(tmp_path, monkeypatch):
    (tmp_path / "99_demo.en.md.j2").write_text(TEMPLATE, encoding="utf-8")
    monkeypatch.setattr(prose, "TEMPLATES", tmp_path)
    return tmp_path


def test_a_template_renders_recorded_figures_and_decisions(templates):
    text = prose.render("99_demo", "summary", RESULTS)
    assert "1.05x (no difference beyond the noise) in float32" in text
    assert "TTFT 83.5 ms" in text and "eager: 45.5 ms. graph: 26.5 ms." in text
    assert prose.blocks("99_demo") == ["summary", "computes"]


def test_audit_mode_names_the_source_of_every_number(templates):
    text = prose.render("99_demo", "summary", RESULTS, audit=True)
    marks = re.findall(r"⟦([^=⟧]+)=([^⟧]*)⟧", text)
    assert ("99_demo.speedup.value", "1.05x") in marks and ("99_demo.rows[1].step_ms", "26.5") in marks
    outside = re.sub(r"⟦[^⟧]*⟧", "", text)
    assert not re.search(r"\d", outside)


def test_too_few_samples_is_said_with_its_counts_marked(templates):
    (templates / "99_demo.en.md.j2").write_text(
        "{% block summary %}{{ direction(m.speedup.low, m.speedup.high) | say }}{% endblock %}", encoding="utf-8")
    few = {**RESULTS, "parameters": {"repeats": 3}}
    assert prose.render("99_demo", "summary", few) == "too few samples to say a direction (3 of the 5 needed)"
    text = prose.render("99_demo", "summary", few, audit=True)
    assert not re.search(r"\d", re.sub(r"⟦[^⟧]*⟧", "", text))
    assert prose.render("99_demo", "summary", RESULTS) == prose.words("en")["no difference beyond the noise"]


def test_templates_cannot_compute_numbers_or_take_them_from_the_notebook(templates):
    with pytest.raises(TypeError, match="templates do not compute numbers"):
        prose.render("99_demo", "computes", RESULTS)
    with pytest.raises(TypeError, match="only as recorded figures"):
        prose.render("99_demo", "summary", RESULTS, speed=3.0)
    with pytest.raises(KeyError, match="no block 'missing'"):
        prose.render("99_demo", "missing", RESULTS)
    with pytest.raises(ValueError, match="lang='xx'"):
        prose.render("99_demo", "summary", RESULTS, lang="xx")


# --- every chapter template, rendered from recorded runs of each device class -----------------------

import json  # noqa: E402
from pathlib import Path  # noqa: E402

FIXTURE_RUNS = Path(__file__).parent / "fixtures" / "runs"
REAL_TEMPLATES = sorted(p for p in prose.TEMPLATES.glob("[0-9][0-9]_*.md.j2"))
# Words that state a direction or a dtype: a template never spells them (decisions say the first,
# the run's records the second), so no sentence can contradict the data beside it.
DIRECTION_WORDS = ("faster", "slower", "fastest", "slowest", "best", "worst", "same effect", "memory-bound",
                   "compute-bound", "grows", "shrinks", "beats", "improves", "speeds up", "barely")
DTYPE_WORDS = ("16-bit", "16 bit", "fp16", "bf16", "float16", "bfloat16", "float32", "fp32")
# the same for the Chinese templates (words.zh.yaml holds their phrases)
ZH_DIRECTION_WORDS = ("更快", "更慢", "最快", "最慢", "最好", "最佳", "效果相同", "内存受限", "带宽受限", "变快",
                      "变慢", "几乎不变", "16 位", "半精度")


def _fixtures():
    found = []
    for path in sorted(FIXTURE_RUNS.glob("*/*/results.json")):
        chapter = path.parent.name
        for lang in prose.LANGUAGES:
            if (prose.TEMPLATES / prose.template_name(chapter, lang)).exists():
                found.append(pytest.param(path, lang, id=f"{path.parent.parent.name}-{chapter}-{lang}"))
    return found


def _source_without_comments(path: Path) -> str:
    """A template's text without its comments; for a one-file template (``<chapter>.md.j2``) its
    catalogs' translations too, since they are what the other languages' readers see."""
    text = re.sub(r"\{#.*?#\}", "", path.read_text(encoding="utf-8"), flags=re.S)
    if path.name.count(".") == 2:
        from babel.messages import pofile

        for lang in prose.LANGUAGES:
            po = prose.catalog_path(path.name.split(".")[0], lang)
            if po.exists():
                with open(po, "rb") as handle:
                    text += "\n" + "\n".join(re.sub(r"%\(\w+\)s", " ", m.string) for m in pofile.read_po(handle) if m.id)
    return text


@pytest.mark.parametrize("template", REAL_TEMPLATES, ids=lambda p: p.name)
def test_templates_spell_no_direction_or_dtype_word(template):
    text = _source_without_comments(template).lower()
    literal = re.sub(r"\{\{.*?\}\}|\{%.*?%\}", " ", text, flags=re.S)  # fixed text only
    for word in DIRECTION_WORDS + DTYPE_WORDS:
        assert not re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", literal), (
            f"{template.name} spells {word!r}: take it from a decision (| say) or from the run's records")
    for word in ZH_DIRECTION_WORDS:
        assert word not in literal, f"{template.name} spells {word!r}: take it from a decision (| say)"


@pytest.mark.parametrize("path, lang", _fixtures())
def test_every_block_renders_only_recorded_numbers(path, lang):
    chapter = path.parent.name
    results = json.loads(path.read_text(encoding="utf-8"))
    run = {p.parent.name: json.loads(p.read_text(encoding="utf-8"))
           for p in path.parent.parent.glob("*/results.json")}
    source = _source_without_comments(prose.TEMPLATES / prose.template_name(chapter, lang))
    fixed_numbers = set(re.findall(r"\d+(?:\.\d+)?", re.sub(r"\{\{.*?\}\}|\{%.*?%\}", " ", source, flags=re.S)))
    for block in prose.blocks(chapter, lang):
        text = prose.render(chapter, block, results, run, lang=lang, audit=True)
        assert text.strip(), f"{chapter}:{block} rendered nothing from {path}"
        for source_name, shown in re.findall(r"⟦([^=⟧]+)=([^⟧]*)⟧", text):
            assert source_name.split(".")[0] in run or source_name.startswith(("100*", "other_dtype", "count")), source_name
        outside = re.sub(r"⟦[^⟧]*⟧", "", text)
        stray = [n for n in re.findall(r"\d+(?:\.\d+)?", outside) if n not in fixed_numbers]
        assert not stray, f"{chapter}:{block} states numbers that are no recorded figure: {stray}"
        dtype = str(results.get("device_choice", {}).get("dtype") or "")
        for word in DTYPE_WORDS:
            if word in outside.lower() and word != dtype:
                raise AssertionError(f"{chapter}:{block} says {word!r} outside the run's records ({dtype} run)")
