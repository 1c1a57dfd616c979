"""The run's pages in a real browser: headless Chromium at 1280 px, as a workshop attendee sees them.

Checks that ``index.html`` and the report chapter's ``claims_report.html`` need no
horizontal scrolling at 1280 px and that every verdict on them carries its class in a
``data-verdict-class`` attribute (so colours and filters never depend on the verdict's wording): those
of a hand-made partial run in the unit tests, those of the English run with the notebooks.
The Chinese pages (a hand-made partial run with ``lang="zh"``, and the Chinese edition's run)
are checked the same way, and their Chinese text must be drawn with a font that has the glyphs: the
probe draws every CJK character of the page on a canvas in the font of its element and compares it
with a character no font has (a missing-glyph box, "tofu"), pixel by pixel, and checks that it is
full-width. Without a CJK font (Debian: ``fonts-noto-cjk``, which ``.ci/run`` installs) it fails; a
test renders a page with the CJK fonts hidden from fontconfig to prove that.
Outside CI the test skips when Chromium is missing; in CI (``CI`` set) a missing browser fails it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import pytest

from helpers import claims
from helpers.results import REPORT_CHAPTER, Results, read_run, workbook_chapters

WIDTH = 1280
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Runs after the page's load event; layout is complete then, images (data: URIs) included.
PROBE = """<script>window.addEventListener("load", function () {
  var root = document.documentElement, body = document.body;
  var tagged = document.querySelectorAll("[data-verdict-class]");
  var classes = [], empty = 0;
  tagged.forEach(function (el) {
    var c = el.getAttribute("data-verdict-class");
    if (!c) { empty += 1; } else if (classes.indexOf(c) < 0) { classes.push(c); }
  });
  var countCells = document.querySelectorAll("table.verdicts td:first-child");
  var untaggedCounts = 0;
  countCells.forEach(function (el) { if (!el.hasAttribute("data-verdict-class")) untaggedCounts += 1; });
  // CJK text: each character drawn in its element's font, compared with a code point no font has.
  var canvas = document.createElement("canvas"), size = 40;
  canvas.width = canvas.height = 2 * size;
  var g = canvas.getContext("2d");
  function pixels(ch, font) {
    g.font = size + "px " + font;
    g.clearRect(0, 0, canvas.width, canvas.height);
    g.fillText(ch, 4, 1.4 * size);
    return Array.prototype.join.call(g.getImageData(0, 0, canvas.width, canvas.height).data, "");
  }
  var cjk = /[\\u3400-\\u4dbf\\u4e00-\\u9fff]/, seen = {}, missing = {}, chars = 0, tofu = [], narrow = [];
  var walker = document.createTreeWalker(body || root, NodeFilter.SHOW_TEXT);
  while (walker.nextNode() && chars < 400) {
    var node = walker.currentNode, parent = node.parentElement;
    if (!parent || !cjk.test(node.nodeValue)) continue;
    var font = getComputedStyle(parent).fontFamily;
    if (!(font in missing)) missing[font] = pixels("\\uDBFF\\uDFFD", font);  // U+10FFFD: no font has it
    for (var ch of node.nodeValue) {
      if (!cjk.test(ch) || seen[ch + font]) continue;
      seen[ch + font] = true; chars += 1;
      if (pixels(ch, font) === missing[font]) tofu.push(ch);
      else if (g.measureText(ch).width < 0.9 * size) narrow.push(ch);  // an ideograph is one em wide
    }
  }
  root.setAttribute("data-probe", JSON.stringify({
    scrollWidth: Math.max(root.scrollWidth, body ? body.scrollWidth : 0),
    clientWidth: root.clientWidth, innerWidth: window.innerWidth,
    tagged: tagged.length, emptyClass: empty, classes: classes, untaggedCounts: untaggedCounts,
    lang: root.getAttribute("lang"), cjkChars: chars, tofu: tofu.join(""), narrow: narrow.join("")}));
});</script>"""


def find_chromium() -> Optional[str]:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing in CI; .ci/run installs the Debian package `chromium`")
        pytest.skip("headless Chromium not installed (Debian/Ubuntu: apt-get install chromium); "
                    "the browser checks of the report pages did not run")
    return path


def probe_page(chromium: str, page: Path, width: int = WIDTH, env: Optional[dict] = None) -> dict:
    """Load a copy of ``page`` (next to it, so relative links resolve) and read the probe's numbers
    (``env``: the browser's environment, e.g. another fontconfig)."""
    text = page.read_text(encoding="utf-8")
    probed = text.replace("</body>", PROBE + "</body>") if "</body>" in text else text + PROBE
    copy = page.with_name(f".probe-{page.name}")
    copy.write_text(probed, encoding="utf-8")
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    try:
        out = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={width},900",
             "--virtual-time-budget=5000", "--dump-dom", copy.resolve().as_uri()],
            capture_output=True, text=True, timeout=180, env=env)
    finally:
        copy.unlink()
        shutil.rmtree(profile, ignore_errors=True)
    match = re.search(r"data-probe=\"([^\"]*)\"", out.stdout)
    assert match, f"Chromium did not run the probe on {page.name} (rc {out.returncode}): {out.stderr[-2000:]}"
    return json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def assert_fits(numbers: dict, name: str) -> None:
    assert numbers["innerWidth"] == WIDTH, numbers
    assert numbers["scrollWidth"] <= numbers["clientWidth"], (
        f"{name} scrolls sideways at {WIDTH} px: content is {numbers['scrollWidth']} px wide, "
        f"the window shows {numbers['clientWidth']} px")


def assert_chinese_shown(numbers: dict, name: str, at_least: int = 20) -> None:
    """A Chinese page, whose Chinese text is drawn with real glyphs: no tofu, every ideograph full-width."""
    assert numbers["lang"] == "zh-CN", f"{name} is not marked as a Chinese page: lang={numbers['lang']!r}"
    assert numbers["cjkChars"] >= at_least, f"{name} shows only {numbers['cjkChars']} distinct CJK characters"
    assert not numbers["tofu"], (
        f"{name}: {len(numbers['tofu'])} of {numbers['cjkChars']} CJK characters are drawn as missing-glyph boxes "
        f"({numbers['tofu'][:40]}): install a CJK font (Debian: apt-get install fonts-noto-cjk)")
    assert not numbers["narrow"], f"{name}: CJK characters drawn narrower than one em: {numbers['narrow'][:40]}"


def test_the_probe_sees_overflow_and_untagged_verdicts(chromium, tmp_path):
    """The checks must be able to fail: a page wider than the window and a count cell without a class."""
    page = tmp_path / "wide.html"
    page.write_text('<!doctype html><html><body><div style="width:3000px">wide</div>'
                    '<table class="verdicts"><tr><td>supported</td><td>3</td></tr></table></body></html>')
    numbers = probe_page(chromium, page)
    with pytest.raises(AssertionError, match="scrolls sideways"):
        assert_fits(numbers, page.name)
    assert numbers["untaggedCounts"] == 1
    page.write_text('<!doctype html><html><body><p>narrow</p><span data-verdict-class="supported">s</span>'
                    '<span data-verdict-class="">x</span></body></html>')
    numbers = probe_page(chromium, page)
    assert_fits(numbers, page.name)
    assert numbers["tagged"] == 2 and numbers["emptyClass"] == 1 and numbers["classes"] == ["supported"]


# The same checks for both editions; a Chinese page must also draw its Chinese text (not boxes).
EDITIONS = [pytest.param("en", "en_run", id="en"), pytest.param("zh", "zh_run", id="zh")]


@pytest.mark.notebooks
@pytest.mark.parametrize("lang, run_fixture", EDITIONS)
def test_index_fits_1280px_and_tags_its_verdict_counts(chromium, request, lang, run_fixture):
    executed = request.getfixturevalue(run_fixture)
    index = executed["run_dir"] / "index.html"
    assert index.exists(), executed["proc"].stdout[-3000:] + executed["proc"].stderr[-3000:]
    numbers = probe_page(chromium, index)
    assert_fits(numbers, f"index.html ({lang})")
    assert numbers["untaggedCounts"] == 0 and numbers["emptyClass"] == 0, numbers
    assert numbers["tagged"] > 0, f"the index shows no verdict counts by class ({REPORT_CHAPTER} is in the run)"
    if lang == "zh":
        assert_chinese_shown(numbers, "index.html (zh)")


@pytest.mark.notebooks
@pytest.mark.parametrize("lang, run_fixture", EDITIONS)
def test_claims_report_fits_1280px_and_every_verdict_carries_its_class(chromium, request, lang, run_fixture):
    executed = request.getfixturevalue(run_fixture)
    page = executed["run_dir"] / REPORT_CHAPTER / "claims_report.html"
    assert page.exists(), f"{REPORT_CHAPTER} ({lang}) wrote no claims_report.html in the run"
    numbers = probe_page(chromium, page)
    assert_fits(numbers, f"claims_report.html ({lang})")
    n_claims = len(claims.load_claims())
    assert numbers["tagged"] >= n_claims, (
        f"{numbers['tagged']} elements carry data-verdict-class, but the audit has {n_claims} claims: "
        "every verdict cell needs its class")
    assert numbers["emptyClass"] == 0, numbers
    assert set(numbers["classes"]) <= set(claims.VERDICT_CLASSES), (numbers["classes"], sorted(claims.VERDICT_CLASSES))
    if lang == "zh":
        assert_chinese_shown(numbers, "claims_report.html (zh)", at_least=200)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_pages_of_a_partial_run_fit_and_tag_every_verdict(chromium, tmp_path, lang):
    """Without the notebooks: the index and claims report of a hand-made partial run, in the browser."""
    from test_report import make_partial_run

    from helpers import report, run

    run_dir = make_partial_run(tmp_path / f"partial-{lang}")
    folder = read_run(run_dir, expected=workbook_chapters())
    audit = claims.verdicts(run_dir)
    page = report.write_claims_report(run_dir / REPORT_CHAPTER / "claims_report.html", run_dir.name, audit,
                                      status=folder.status_table(), figures=report.key_figures(folder.results()),
                                      plots=[report.plot_verdicts(audit), report.plot_ladder(folder.results())],
                                      lang=lang)
    numbers = probe_page(chromium, page)
    assert_fits(numbers, page.name)
    assert numbers["tagged"] == len(claims.VERDICT_CLASSES) + len(audit) and numbers["emptyClass"] == 0
    assert set(numbers["classes"]) <= set(claims.VERDICT_CLASSES)
    if lang == "zh":
        assert_chinese_shown(numbers, page.name, at_least=200)
    res = Results(REPORT_CHAPTER, run_dir)
    res.table("verdict_counts", [{"verdict_class": c, "claims": n} for c, n in claims.verdict_counts(audit).items()])
    res.finish()
    index = run.write_index(run_dir, {**json.loads((run_dir / "run.json").read_text()), "lang": lang})
    numbers = probe_page(chromium, index)
    assert_fits(numbers, index.name)
    assert numbers["untaggedCounts"] == 0 and numbers["tagged"] == 2 * len(claims.VERDICT_CLASSES)
    if lang == "zh":
        assert_chinese_shown(numbers, index.name)


# --- the Chinese pages ---------------------------------------------------------------------------

SAMPLE_ZH = ('<!doctype html><html lang="zh-CN"><head><meta charset="utf-8"><style>{css}</style></head><body>'
             "<p>说法审查与运行报告：每条说法及其判定，按指南章节分组。首 token 时延与解码吞吐。</p></body></html>")


def _fontconfig_without_cjk(tmp_path: Path) -> dict:
    """An environment whose fontconfig hides every font that covers Chinese (the machine's other fonts stay)."""
    if shutil.which("fc-list") is None:
        pytest.skip("fc-list (fontconfig) is missing: cannot hide the CJK fonts from the browser")
    conf = tmp_path / "fonts.conf"
    conf.write_text(f"""<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig>
  <include ignore_missing="yes">/etc/fonts/fonts.conf</include>
  <selectfont><rejectfont><pattern><patelt name="lang"><string>zh-cn</string></patelt></pattern></rejectfont></selectfont>
  <cachedir>{tmp_path / "fontconfig-cache"}</cachedir>
</fontconfig>
""")
    env = {**os.environ, "FONTCONFIG_FILE": str(conf)}
    left = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True, env=env).stdout.strip()
    if left or not subprocess.run(["fc-list"], capture_output=True, text=True, env=env).stdout.strip():
        pytest.skip(f"could not hide the CJK fonts and keep the others (left: {left[:200]!r})")
    return env


def test_the_probe_sees_tofu_when_no_font_has_the_glyphs(chromium, tmp_path):
    """The CJK check must be able to fail: with the CJK fonts hidden, Chinese text is missing-glyph boxes."""
    from helpers import pages

    page = tmp_path / "zh.html"
    page.write_text(SAMPLE_ZH.format(css=pages.stylesheet()), encoding="utf-8")
    shown = probe_page(chromium, page)
    assert_chinese_shown(shown, page.name)
    hidden = probe_page(chromium, page, env=_fontconfig_without_cjk(tmp_path))
    assert hidden["cjkChars"] == shown["cjkChars"] and len(hidden["tofu"]) == hidden["cjkChars"], hidden
    with pytest.raises(AssertionError, match="missing-glyph boxes"):
        assert_chinese_shown(hidden, page.name)
