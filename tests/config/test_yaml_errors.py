"""`stillroom config FILE` on a YAML syntax error, an empty file or a tab indent names the file,
line and column (`snakemake --configfile` gives Snakemake's own message, unpatched)."""

from __future__ import annotations

import pytest

from stillroom.cli import main

CASES = {
    # name: (text, the message after "<path>")
    "syntax": (
        "seed: 1\nmerge:\n  ratios: [0.5, 0.7\nexperiment: x\n",
        ":4:11: not valid YAML: expected ',' or ']', but got ':' (while parsing a flow sequence "
        "at line 3, column 11)",
    ),
    "empty": ("# nothing yet\n\n", ": empty: expected a mapping of config sections"),
    "tab": (
        "seed: 1\nmerge:\n\tratios: [0.5]\n",
        ":3:1: not valid YAML: found character '\\t' that cannot start any token; YAML indents "
        "with spaces only",
    ),
}


@pytest.mark.parametrize("form", ["bare", "--configfile"])
@pytest.mark.parametrize("case", CASES)
def test_stillroom_config_names_the_file_and_line(tmp_path, case, form, capsys):
    text, said = CASES[case]
    bad = tmp_path / f"{case}.yaml"
    bad.write_text(text)
    args = ["config", str(bad)] if form == "bare" else ["config", "--configfile", str(bad)]
    assert main(args) == 2
    assert f"stillroom config: error: {bad}{said}\n" in capsys.readouterr().err
