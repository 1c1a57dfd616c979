"""Templates render only recorded figures, with direction words from helpers.decide."""
import re

import pytest

from helpers import prose

RESULTS = {"chapter": "99_demo", "parameters": {"repeats": 3},
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


def test_templates_cannot_compute_numbers_or_take_them_from_the_notebook(templates):
    with pytest.raises(TypeError, match="templates do not compute numbers"):
        prose.render("99_demo", "computes", RESULTS)
    with pytest.raises(TypeError, match="only as recorded figures"):
        prose.render("99_demo", "summary", RESULTS, speed=3.0)
    with pytest.raises(KeyError, match="no block 'missing'"):
        prose.render("99_demo", "missing", RESULTS)
    with pytest.raises(ValueError, match="lang='xx'"):
        prose.render("99_demo", "summary", RESULTS, lang="xx")
