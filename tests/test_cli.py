"""The CLI: one command per stage, params and paths parsed, provenance written beside every output;
bad input is a clear error and exit status 2."""

import itertools
import json
import re

import yaml

from stillroom import cli
from stillroom.config import config_hash
from stillroom.io import read_json
from stillroom.provenance.sidecars import digest, sidecar_path

from .stages.test_tables import PARAMS, _graded


def test_cli_runs_a_stage_and_writes_provenance(tmp_path, monkeypatch, capsys):
    graded = {"base": _graded(tmp_path / "b.jsonl", 0.1), "sft": _graded(tmp_path / "s.jsonl", 0.5)}
    snapshot = tmp_path / "config.json"  # the resolved config's snapshot, recorded by its hash
    snapshot.write_text(json.dumps({"experiment": "small", "seed": 1}))
    monkeypatch.setenv("STILLROOM_API_KEY", "sk-secret")
    params = PARAMS  # typed params refuse unknown keys: secret params, see test_provenance.py
    md = tmp_path / "out" / "t.md"
    rc = cli.main(
        [
            "tables",
            "--graded",
            *[f"{k}={v}" for k, v in graded.items()],
            "--out-markdown",
            str(md),
            "--out-csv",
            str(tmp_path / "out" / "t.csv"),
            "--out-html",
            str(tmp_path / "out" / "t.html"),
            "--out-latex",
            str(tmp_path / "out" / "t.tex"),
            "--out-plot",
            str(tmp_path / "out" / "t.png"),
            "--params",
            json.dumps(params),
            "--rule",
            "tables",
            "--config",
            str(snapshot),
        ]
    )
    assert rc == 0
    prov = read_json(sidecar_path(md))
    assert (
        prov["sha256"] == digest(md)["sha256"]
        and prov["rule"] == "tables"
        and prov["config_sha256"] == config_hash(json.loads(snapshot.read_text()))
    )
    assert [i["sha256"] for i in prov["inputs"]["graded"]] == [
        digest(p)["sha256"] for p in graded.values()
    ]
    assert (
        set(prov["outputs"]) == {"markdown", "csv", "latex", "plot", "html"}
        and prov["metrics"]["wall_s"] >= 0
    )
    text = json.dumps(prov)
    assert "sk-secret" not in text
    assert "done in" in capsys.readouterr().err  # progress goes to stderr, the rule's log


def test_cli_bad_input_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "g.jsonl"
    bad.write_text(
        '{"prompt_id": "p", "sample_index": 0, "completion_tokens": 3, '
        '"grade": {"correct": true}}\n{oops\n'
    )
    rc = cli.main(
        [
            "tables",
            "--graded",
            f"base={bad}",
            f"sft={bad}",
            "--out-markdown",
            str(tmp_path / "t.md"),
            "--out-csv",
            str(tmp_path / "t.csv"),
            "--out-html",
            str(tmp_path / "t.html"),
            "--out-latex",
            str(tmp_path / "t.tex"),
            "--out-plot",
            str(tmp_path / "t.png"),
            "--params",
            json.dumps(PARAMS),
        ]
    )
    assert rc == 2
    assert "g.jsonl:2: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "t.md").exists() and not sidecar_path(tmp_path / "t.md").exists()
    assert (
        cli.main(
            [
                "tables",
                "--graded",
                "base=x",
                "--out-markdown",
                "a",
                "--out-csv",
                "b",
                "--out-html",
                "e",
                "--out-latex",
                "d",
                "--out-plot",
                "c",
                "--params",
                "{not json",
            ]
        )
        == 2
    )


def test_a_lone_surrogate_in_a_source_is_one_line_naming_file_line_and_key(tmp_path, capsys):
    """Issue 29: it was "'utf-8' codec can't encode character '\\ud800' in position 12:
    surrogates not allowed", raised when the pool was written, naming no file."""
    src = tmp_path / "web.jsonl"
    src.write_text(
        '{"prompt": "What is 1 + 1?", "answer": "2", "kind": "math"}\n'
        '{"prompt": "What is \\ud800 + 2?", "answer": "4", "kind": "math"}\n'
    )
    params = {
        "heldout": {"size": 0},
        "sources": [{"name": "web", "kind": "jsonl", "path": str(src)}],
    }
    out = [f"--out-{k}={tmp_path / k}.jsonl" for k in ("pool", "heldout", "dev")]
    rc = cli.main(["pool", "--benchmarks", *out, "--params", json.dumps(params)])
    err = capsys.readouterr().err.strip().splitlines()
    # the job's params header, then the one error line
    header, *params, error = err
    assert rc == 2 and header.endswith("] params:") and all(p.startswith("  ") for p in params)
    assert error == (
        f"stillroom pool: error: source 'web': {src}:2: key 'prompt' holds a lone surrogate "
        "(\\ud800 at character 9), which is not text; expected a character or a whole "
        "surrogate pair"
    )
    assert not (tmp_path / "pool.jsonl").exists()


def test_a_jobs_log_opens_with_its_typed_params_as_yaml(tmp_path, capsys):
    """The rule passes one JSON string; the log shows the stage's parsed params, a key per line,
    defaults filled in."""
    from stillroom.stages.merge import Params

    rc = cli.main(
        ["merge", "--base", str(tmp_path / "no-base"), "--tuned", str(tmp_path / "no-tuned")]
        + ["--out-model", str(tmp_path / "m"), "--params", json.dumps({"ratio": 0.25})]
    )
    err = capsys.readouterr().err.splitlines()
    assert rc != 0 and re.fullmatch(r"\[merge +0\.\ds\] params:", err[0])
    block = list(itertools.takewhile(lambda line: line.startswith("  "), err[1:]))
    typed = Params.parse({"ratio": 0.25}).param_values()
    assert block == ["  ratio: 0.25", "  seed: 0", "  weight_hooks: []"]
    assert yaml.safe_load("\n".join(block)) == typed


# -- the commands a user types, apart from the stages the rules run (issue 42, stumble 7) ----------


def _help_sections() -> dict[str, list[str]]:
    """`stillroom --help`'s command lists: section title -> command names, in order."""
    sections: dict[str, list[str]] = {}
    title = None
    for line in cli.build_parser().format_help().splitlines():
        if line.endswith(":") and not line.startswith(" "):
            title = line[:-1]
            sections[title] = []
        elif title and re.match(r"^  \S", line):
            sections[title].append(line.split()[0])
    return sections


def test_help_lists_the_user_commands_apart_from_the_stages_the_rules_run():
    """It was one flat list of 30 commands, stages first, and the SLURM plan was not in it."""
    sections = _help_sections()
    users = sections["user commands"]
    stages = sections["stage commands (run by the workflow's rules; see rules/*.smk)"]
    ruled = set(re.findall(r'stillroom_cli\(\s*"(\w+)"', _rules_text()))
    # the servers' rules run `stillroom serve` (rules/common.smk serve_cli)
    ruled |= set(re.findall(r"exec stillroom (\w+)", _rules_text()))
    assert set(stages) == ruled, "the stage list is exactly what the rules run"
    assert {"config", "estimate", "plan", "show", "audit", "bundle"} <= set(users)
    assert not set(users) & ruled
    # every command is in one list or the other
    assert set(users) | set(stages) == set(cli.build_parser()._subparsers._group_actions[0].choices)


def _rules_text() -> str:
    from stillroom.workflow import REPO

    return "".join(p.read_text() for p in sorted((REPO / "rules").glob("*.smk")))


def test_every_command_has_a_summary_and_a_description():
    """`config`, `show`, `audit` and `bundle` had no description in their own --help."""
    choices = cli.build_parser()._subparsers._group_actions[0].choices
    listed = cli.build_parser().format_help()
    for name, parser in choices.items():
        assert parser.description, f"stillroom {name} --help has no description"
    for name in choices:
        assert re.search(rf"^  {re.escape(name)} +\S", listed, re.M), f"{name}: no summary"


def test_configfile_is_taken_wherever_a_config_is(tmp_path, capsys):
    """`config` took a positional file, `estimate` --configfile; both forms now work for `config`
    (rules, tests and scripts use the positional one), and --configfile for every command."""
    from stillroom.workflow import REPO

    default = str(REPO / "config" / "config.yaml")
    printed = []
    for args in ([default], ["--configfile", default]):
        assert cli.main(["config", *args, "--root", str(REPO)]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and json.loads(printed[0])["experiment"]
    missing = tmp_path / "nope.yaml"
    for command in ("config", "estimate", "stand-ins"):
        assert cli.main([command, "--configfile", str(missing), "--root", str(REPO)]) == 2
        assert str(missing) in capsys.readouterr().err, command
    assert cli.build_parser().parse_args(
        ["plan", "--configfile", "a.yaml", "b.yaml"]
    ).configfile == [
        "a.yaml",
        "b.yaml",
    ]
