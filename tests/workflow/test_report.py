"""What a reader of a finished run sees. The ``snakemake --report`` HTML: every table shown inline
with its caption and its job's parameters as a key/value list, no docutils message anywhere, a
clean report on copied results, and what a real headless browser shows of it. ``stillroom show``'s
list of each table's files, and the per-effort table's word on why its accuracies differ from the
paired table's."""

import base64
import json
import re
import shutil
import time

import pytest

from stillroom.io import read_json
from stillroom.stages.tables import show

from ..conftest import run_snakemake
from .browser import MISSING, Browser, ocr

pytestmark = pytest.mark.slow

# how docutils reports a problem in a caption: "(ERROR/3) Unknown target name" on stderr and a
# "Docutils System Messages" section in the HTML
DOCUTILS = re.compile(r"\((?:DEBUG|INFO|WARNING|ERROR|SEVERE)/\d\)|System Messages?|system-message")


@pytest.fixture(scope="module")
def report(done, tmp_path_factory):
    workdir, cfg, _ = done
    out = tmp_path_factory.mktemp("report") / "report.html"
    proc = run_snakemake(workdir, cfg, "--report", str(out))
    return out.read_text(), proc.stdout + proc.stderr


def results(html: str) -> dict:
    """The report's results: path -> name, caption, mime type, data URI, as the page holds them."""
    block = re.search(r'<script id="results">(.*?)</script>', html, re.S)[1]
    return json.loads(block[block.index("{") : block.rindex("}") + 1])


def page(result: dict) -> str:
    """The bytes a result's data URI carries, as text."""
    return base64.b64decode(result["data_uri"].split("base64,", 1)[1]).decode()


def test_the_report_has_no_docutils_message(report):
    html, log = report
    assert not DOCUTILS.findall(log), log[-3000:]
    assert not DOCUTILS.findall(html)
    assert "Cost ledger" in html  # the cost caption, where `est_` made the message, is rendered


def test_every_table_shows_inline_with_its_caption_and_parameters(report, done):
    html, _ = report
    workdir, cfg, _ = done
    shown = results(html)
    tables = {r["name"]: r for r in shown.values() if r["name"].endswith(".html")}
    expected = {p.name for p in (workdir / "results" / "small").glob("*/*.html")}
    assert expected and set(tables) == expected  # every table page, the cost ledger's too
    for name, r in tables.items():
        assert r["mime_type"] == "text/html", name  # the report frames it: no download only
        text = page(r)
        written = (workdir / "results" / "small" / "tables" / name).with_suffix(".md")
        if written.is_file():  # its caption, as the Markdown has it, above the table
            caption = written.read_text().splitlines()[0].removeprefix("### ")
            assert caption.split(":")[0] in text and "<table>" in text, name
        assert "<dt>seed</dt>" in text, name  # the job's parameters, a key per line
    heldout = page(tables["heldout.html"])
    # the caption's notes a CSV never carried: the merge chosen on dev, the random-weight base
    assert "chosen on dev" in heldout and "random-weight initialisation" in heldout
    assert "<dt>n_resamples</dt><dd>500</dd>" in heldout
    assert "\\&quot;" not in heldout  # no escaped JSON blob


def test_a_report_on_copied_results_is_clean_with_the_runs_metadata(done, tmp_path):
    """Snakemake's report reads each output's job record from .snakemake/metadata: results copied
    without it warn "Missing metadata" once per file (184 on the default run) yet show every table;
    copied with it (as the README says), the report is clean."""
    workdir, cfg, _ = done
    for copy, metadata in ((tmp_path / "bare", False), (tmp_path / "with", True)):
        shutil.copytree(workdir / "results", copy / "results", symlinks=True)
        if metadata:
            shutil.copytree(workdir / ".snakemake" / "metadata", copy / ".snakemake" / "metadata")
        proc = run_snakemake(copy, cfg, "--report", "report.html")
        log = proc.stdout + proc.stderr
        assert ("Missing metadata" in log) is not metadata, log[-3000:]
        names = {r["name"] for r in results((copy / "report.html").read_text()).values()}
        assert {"heldout.html", "heldout.csv", "heldout.png", "ledger.html"} <= names


@pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} (make host)")
def test_a_headless_browser_shows_the_table_caption(report, tmp_path):
    html, _ = report
    path = tmp_path / "report.html"
    path.write_text(html)
    heldout = json.dumps(next(p for p, r in results(html).items() if r["name"] == "heldout.html"))
    browser = Browser(tmp_path / "profile")
    try:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=path.as_uri())
        browser.wait_for("typeof app !== 'undefined' && typeof app.showCategory === 'function'")
        # what a click on the Tables category, then on the heldout table's eye button, does
        browser.evaluate(
            f"app.showCategory('Tables'); app.setView({{content: 'html', resultPath: {heldout}, "
            f"contentPath: results[{heldout}].data_uri}})"
        )
        browser.wait_for("document.querySelector('iframe') !== null")
        # the frame's page is of another origin (a data URI): read back from the screen, until
        # it has drawn or 30 s have passed (a bound far above a drawing's time)
        end = time.monotonic() + 30
        while True:
            shot = browser.screenshot(tmp_path / "report.png")
            text = " ".join(ocr(shot).split())
            if "chosen on dev" in text or time.monotonic() > end:
                break
            time.sleep(1)
    finally:
        browser.close()
    assert "paired bootstrap" in text and "Holm" in text, text  # the caption, above the table
    assert "chosen on dev" in text and "random-weight" in text, text  # its notes
    assert "Job parameters" in text and "n_resamples" in text, text


def test_show_lists_only_the_files_each_table_has(done, capsys):
    workdir, _, _ = done
    exp = workdir / "results" / "small"
    show(str(exp))
    listed = dict(
        line.strip().rsplit(": ", 1)
        for line in capsys.readouterr().out.split("Tables (the files", 1)[1].splitlines()[1:]
    )
    for md in (exp / "tables").glob("*.md"):
        kinds = sorted(f.suffix for f in md.parent.glob(f"{md.stem}.*") if f.suffix != ".json")
        assert listed[str(md.with_suffix(""))] == ", ".join(kinds)
    assert ".tex" not in listed[str(exp / "tables" / "heldout-budgets")]  # only the paired has one
    assert ".tex" in listed[str(exp / "tables" / "heldout")]


def test_the_effort_table_says_why_its_accuracy_differs_from_the_paired_tables(done):
    """sft read 0.142 in heldout.md and 0.147 in heldout-efforts.md: two evaluations, the paired
    one untagged, the per-effort one tagged with each effort, so other prompts and samples."""
    workdir, _, _ = done
    exp = workdir / "results" / "small"
    paired = read_json(exp / "eval" / "sft" / "heldout" / "samples.jsonl.prov.json")["params"]
    tagged = read_json(
        exp / "eval" / "sft" / "heldout" / "effort-medium" / "samples.jsonl.prov.json"
    )["params"]
    assert paired.get("effort") is None and tagged["effort"] == "medium"
    assert {k: v for k, v in paired.items() if k != "effort"} == {
        k: v for k, v in tagged.items() if k != "effort"
    }  # the effort tag is the only difference between the two evaluations
    caption = (exp / "tables" / "heldout-efforts.md").read_text().splitlines()[0]
    assert "evaluation of its own, the prompts tagged with that effort" in caption
    assert "untagged by default" in caption
