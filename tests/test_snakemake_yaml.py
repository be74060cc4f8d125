"""`snakemake --configfile` on a YAML syntax error, an empty file or a tab indent names the file and
line, through a real Snakemake process with the .pth `make venv` installs
(stillroom/snakemake_yaml.py); `stillroom config` says the same."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stillroom.cli import main
from stillroom.snakemake_yaml import PTH_LINE, explained, pth_path
from stillroom.workflow import snakemake_command, snakemake_env

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


@pytest.fixture(scope="module")
def hook_installed():
    assert pth_path().is_file() and pth_path().read_text() == PTH_LINE, (
        f"{pth_path()} missing: `make venv` writes it (stillroom.snakemake_yaml.main)"
    )


@pytest.mark.parametrize("case", CASES)
def test_snakemake_names_the_file_and_line_of_a_bad_configfile(tmp_path, case, hook_installed):
    text, said = CASES[case]
    bad = tmp_path / f"{case}.yaml"
    bad.write_text(text)
    proc = subprocess.run(
        snakemake_command(tmp_path, "-n", "--cores", "1", configfiles=[bad]),
        capture_output=True,
        text=True,
        env=snakemake_env(),
        cwd=tmp_path,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"Config file {bad}{said}\n" in out, out[-2000:]
    assert "not valid JSON or YAML" not in out and "keys at top level" not in out
    assert "Traceback" not in out


@pytest.mark.parametrize("case", CASES)
def test_stillroom_config_says_the_same(tmp_path, case, capsys):
    text, said = CASES[case]
    bad = tmp_path / f"{case}.yaml"
    bad.write_text(text)
    assert main(["config", str(bad)]) == 2
    assert f"stillroom config: error: {bad}{said}\n" in capsys.readouterr().err


def test_a_good_file_is_loaded_by_snakemake_itself(tmp_path):
    from snakemake.common import configfile

    loader = configfile._load_configfile
    original = getattr(loader, "__wrapped__", loader)
    good = tmp_path / "good.yaml"
    good.write_text("seed: 1\nmerge: {ratios: [0.5]}\n")
    as_json = tmp_path / "good.json"
    as_json.write_text('{"seed": 1}')
    wrapped = explained(original)
    for path in (good, as_json, str(good)):
        assert wrapped(path) == original(path)
    # a schema (not a config file) is Snakemake's own business
    schema = tmp_path / "schema.yaml"
    schema.write_text("a: [1\n")
    with pytest.raises(Exception, match="Schema file is not valid JSON or YAML"):
        wrapped(schema, "Schema")


def test_the_pth_line_is_a_no_op_without_the_module(tmp_path):
    # e.g. the package uninstalled, its .pth left behind: Python starts, silently
    proc = subprocess.run(
        [sys.executable, "-I", "-c", PTH_LINE.replace("stillroom", "nothere")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and proc.stderr == ""
