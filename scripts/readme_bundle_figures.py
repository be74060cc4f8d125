"""Write the documented figures for the review bundle (docs/provenance.md) from a real run.

    python scripts/readme_bundle_figures.py results/tiny

bundles the experiment twice (with and without the snakemake report) into a scratch directory and
rewrites the sentence between docs/provenance.md's ``bundle-figures`` markers with the archive
sizes and file counts measured; ``--check`` only says whether the documented sentence is the one
this run gives (exit 1 if not). tests/review/test_bundle.py holds that sentence to this script's
format.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "provenance.md"  # where the bundle is described
START, END = "<!-- bundle-figures -->", "<!-- /bundle-figures -->"
BLOCK = re.compile(re.escape(START) + r"(.*?)" + re.escape(END), re.S)


def measure(exp: str) -> dict[str, float]:
    """The bundle of ``exp`` without and with the report: zip MB, files, unpacked MB."""
    from stillroom.review.bundle import write

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="readme-figures-") as tmp:
        for report in (False, True):
            path, manifest = write(exp, Path(tmp) / f"b{int(report)}.zip", report=report)
            tag = "report" if report else "plain"
            out[f"{tag}_mb"] = path.stat().st_size / 1e6
            out[f"{tag}_files"] = len(manifest["files"])
            out[f"{tag}_unpacked_mb"] = sum(e["size"] for e in manifest["files"]) / 1e6
    return out


def sentence(f: dict[str, float]) -> str:
    """The documented words for the figures (the test parses them back with ``FIGURES``)."""
    return (
        f"The default run's is {f['plain_mb']:.2f} MB without the report ({f['plain_files']:.0f} "
        f"files, {f['plain_unpacked_mb']:.1f} MB unpacked, most of it the graded records); with "
        f"the report {f['report_mb']:.2f} MB ({f['report_files']:.0f} files)."
    )


FIGURES = re.compile(
    r"The default run's is \d+\.\d\d MB without the report \(\d+ files, \d+\.\d MB unpacked, "
    r"most of it the graded records\); with the report \d+\.\d\d MB \(\d+ files\)\.$"
)


def readme_sentence(text: str) -> str:
    """The documented sentence between the markers, on one line."""
    match = BLOCK.search(text)
    if match is None:
        raise SystemExit(f"{DOC}: no {START} ... {END} block")
    return " ".join(match[1].split())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment_dir", help="results/<experiment> of the default run (results/tiny)")
    ap.add_argument("--check", action="store_true", help="compare, do not rewrite")
    args = ap.parse_args(argv)
    measured = sentence(measure(args.experiment_dir))
    text = DOC.read_text()
    if args.check:
        same = readme_sentence(text) == measured
        print(
            f"{DOC.name}'s figures match"
            if same
            else f"{DOC.name} says:\n  {readme_sentence(text)}\nthe run gives:\n  {measured}"
        )
        return 0 if same else 1
    DOC.write_text(BLOCK.sub(lambda _: f"{START}{measured}{END}", text))
    print(measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
