"""Issue 34: strings from a trace (kernel names, ops, stack frames, annotations, file names) are
shown as written and do nothing else: in the Markdown report (a pull-request comment) and in the
tab (text nodes only; the browser half is tests/test_browser.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from synth_kineto import kineto_trace, write_trace

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import build_report
from tb_gpuadvisor.render import html_escape, md_escape, render_markdown, render_text

FRONTEND = Path(__file__).resolve().parent.parent / "frontend"
# HTML, a Markdown link and image to another site, a code span, emphasis, a table cell, a bare URL,
# a link to a file outside the logdir, and a line break that would start a heading.
HOSTILE = ("<img src=x onerror=alert(1)>&amp;[click](https://evil.example/x) ![p](https://evil.example/p.png)"
           " `tick` *em* | cell <file:///etc/passwd> [ref][1] www.evil.example\n# heading\x1b[31m")


def _hostile_report(tmp_path: Path) -> dict:
    """A PyTorch run whose kernels, ops, annotations and Python frames are named HOSTILE+name, on a
    GPU HOSTILE names: analysed by the real pipeline."""
    trace = kineto_trace(steps=4, kernels=12, input_us=300, sync_us=200)
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and event["name"].startswith(("void ", "aten::", "train.py", "cudaLaunch")):
            event["name"] = HOSTILE + event["name"]
    trace["deviceProperties"] = [{"id": 0, "name": HOSTILE, "computeMajor": 8, "computeMinor": 0, "numSms": 108,
                                  "totalGlobalMem": 80 << 30}]
    write_trace(tmp_path / "run" / "worker0.pt.trace.json", trace)
    return build_report(find_sessions(str(tmp_path)))


def _assert_inert(markdown: str) -> None:
    assert "<img" not in markdown and "<file:" not in markdown
    assert "](" not in markdown and "][" not in markdown
    assert not re.search(r"(?<!\\)`tick", markdown) and not re.search(r"(?<!\\)\*em", markdown)
    assert "https://evil" not in markdown and "www.evil" not in markdown
    assert not re.search(r"^# heading", markdown, re.MULTILINE) and "\x1b" not in markdown


def test_hostile_names_from_a_trace_are_inert_in_the_markdown_report(tmp_path):
    report = _hostile_report(tmp_path)
    markdown = render_markdown(report)
    assert "/device:GPU:0, &lt;img src=x onerror=alert(1)&gt;&amp;amp;[click]\\(https\\://evil" in markdown
    _assert_inert(markdown)
    assert "\x1b" not in render_text(report) and "\\x1b[31m" in render_text(report)


def test_every_field_of_a_report_is_escaped(tmp_path):
    """Every string the Markdown renderer prints, each set to HOSTILE: run and session names,
    hosts, errors, device names, titles, summaries, confidence reasons, metrics, fixes."""
    report = _hostile_report(tmp_path)
    session = report["sessions"][0]
    session.update(run=HOSTILE, session=HOSTILE, hosts=[HOSTILE],
                   errors=[{"host": HOSTILE, "file": HOSTILE, "message": HOSTILE}])
    for finding in session["findings"]:
        finding.update(title=HOSTILE, summary=HOSTILE, confidence_reasons=[HOSTILE], severity="warning",
                       metrics={"name": HOSTILE})
        for fix in finding["fixes"]:
            fix["text"] = HOSTILE
    _assert_inert(render_markdown(report))


@pytest.mark.parametrize("text, shown", [
    ("aten::conv2d", "aten::conv2d"),
    ("volta_sgemm_128x64_nn", "volta_sgemm_128x64_nn"),             # intraword _ is text in GFM
    ("pip install 'tensorflow[and-cuda]'", "pip install 'tensorflow[and-cuda]'"),
    ("[x](y)", "[x]\\(y)"),
    ("![x][y]", "![x]\\[y]"),
    ("a\nb", "a b"),
    ("c:\\path", "c:\\\\path"),
    ("see https://x.org", "see https\\://x.org"),
])
def test_md_escape_keeps_plain_names_and_breaks_markup(text, shown):
    assert md_escape(text) == shown


def test_html_escape_is_for_lines_of_html():
    assert html_escape("<b>*x*</b>\n`y`") == "&lt;b&gt;*x*&lt;/b&gt; `y`"


def test_the_tab_puts_trace_strings_in_as_text_only():
    """The frontend builds every element through h(): text goes in as text nodes (textContent),
    attributes through setAttribute; it never parses HTML, and a link's address is one it made
    (the Profile tab, the trace viewer) or a web address checked by safeDocUrl, never a name or a
    file path from the trace."""
    sources = {path.name: path.read_text() for path in FRONTEND.glob("*.js")}
    for name, source in sources.items():
        code = re.sub(r"//.*", "", source)
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                     "createContextualFragment", "DOMParser"):
            assert sink not in code, (name, sink)
    views = sources["views.js"]
    hrefs = re.findall(r"href: ([^,}]+)", views)
    assert hrefs and all(re.fullmatch(r"doc|href|profileUrl\(.*", h.strip()) for h in hrefs), hrefs
    assert "const doc = fix.doc ? safeDocUrl(fix.doc) : null;" in views
    assert "const href = range && traceRangeUrl(" in views
    assert json.dumps(HOSTILE)      # the payload the browser test shows as text
