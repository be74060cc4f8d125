"""The workflow's files as Snakemake users expect them: one rules/<stage>.smk per
stillroom/stages/<stage>.py, every rule with a log (its job's stdout and stderr), a timing file
(`benchmark:`) and a conda environment, nothing written while the workflow is parsed, and a clean
`snakemake --lint`."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from stillroom import cli
from stillroom.cli import STAGES
from stillroom.config import load_yaml, resolve

from ..conftest import REPO, recipe_files
from ..readme import repo_copy

RECIPES = [None, *sorted((REPO / "config" / "experiments").glob("*.yaml"))]


def _snakemake(
    *args: str, cwd: Path, configfiles=(), snakefile: Path = REPO / "Snakefile"
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile), "-d", str(cwd), *args]
    if configfiles:
        cmd += ["--configfile", *map(str, configfiles)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def _configfiles(recipe):
    if recipe is None:
        return []
    return recipe_files(recipe)


def test_every_stage_module_has_its_rule_file_and_back():
    # contract.py is how a stage module declares its stages, not a stage module
    modules = (REPO / "stillroom" / "stages").glob("*.py")
    stages = {p.stem for p in modules} - {"__init__", "contract"}
    rules = {p.stem for p in (REPO / "rules").glob("*.smk")} - {"common"}
    assert stages == rules
    for name, stage in STAGES.items():  # every CLI stage is a function of a stage module
        module, _, _ = stage.function.__module__.removeprefix("stillroom.stages.").partition(".")
        assert module in stages, name


def test_every_rule_logs_times_and_names_its_environment():
    rules = 0
    for smk in (REPO / "rules").glob("*.smk"):
        text = smk.read_text()
        for block in re.split(r"\n(?=[ \t]*rule\b)", text)[1:]:
            rules += 1
            # a server's rule has no timing file: Snakemake stops it, and its benchmark: file
            # would be missing (rules/serve.smk)
            timed = ("benchmark:",) if "serve_cli(" not in block else ()
            for directive in ("log:", *timed, "conda:", "shell:"):
                assert directive in block, f"{smk.name}: a rule without {directive}\n{block[:200]}"
            # a server's rule runs `stillroom serve`, no stage: it writes no artifact
            called = "stillroom_cli(" in block or "serve_cli(" in block
            assert called, f"{smk.name}: a rule not calling its stage"
    assert rules >= 20
    common = (REPO / "rules" / "common.smk").read_text()
    assert '>> {{log:q}} 2>&1"' in common  # stdout and stderr of every stage go to its log


def test_the_conda_environment_lists_the_project_dependencies():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]

    def names(requirements):
        return {re.split(r"[<>=!;\[ ]", r.strip())[0].lower(): r for r in requirements}

    wanted = {name: re.sub(r"\s*;.*", "", spec) for name, spec in names(deps).items()}
    for env, pinned in (("stillroom", {"torch": "torch==2.13.0"}), ("sglang", {})):
        spec = yaml.safe_load((REPO / "envs" / f"{env}.yaml").read_text())
        pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
        have = names(pip)
        for name, requirement in wanted.items():
            if name == "torch" and env == "sglang":  # SGLang brings its own torch
                continue
            assert have.get(name) == pinned.get(name, requirement), (env, name, have.get(name))
        extra = set(have) - set(wanted) - {"sglang"}
        assert not extra, f"envs/{env}.yaml lists what pyproject.toml does not: {extra}"
        assert (REPO / "envs" / f"{env}.post-deploy.sh").exists()


# A dry run and a lint per recipe, seconds each: the default in the fast tier, the recipes in the
# full suite only (make test)
@pytest.mark.parametrize(
    "recipe",
    [
        pytest.param(r, id=r.stem if r else "default", marks=[pytest.mark.slow] if r else [])
        for r in RECIPES
    ],
)
def test_parsing_writes_nothing_and_lint_is_clean(dry_run, recipe, tmp_path):
    """A dry run and a lint of every recipe: nothing appears in the working directory but
    Snakemake's own state, and the linter finds nothing. A recipe naming stand-in models (a
    missing local student is refused while the DAG is built) runs in a copy of the repository
    where `stillroom stand-ins` has built them, as the README runs it."""
    snakefile, configfiles = REPO / "Snakefile", _configfiles(recipe)
    if any(
        "stand-ins" in str(load_yaml(c).get("student", {}).get("pretrained")) for c in configfiles
    ):
        copy = repo_copy(tmp_path / "repo")
        configfiles = [copy / Path(c).relative_to(REPO) for c in configfiles]
        stand_ins = ["stand-ins", "--configfile", *map(str, configfiles), "--root", str(copy)]
        subprocess.run([sys.executable, "-m", "stillroom", *stand_ins], check=True, timeout=600)
        snakefile, workdir = copy / "Snakefile", tmp_path / "work"
        workdir.mkdir()
        dry = _snakemake("-n", "-p", "--cores", "2", cwd=workdir, configfiles=configfiles,
                         snakefile=snakefile)  # fmt: skip
    else:
        workdir, dry = dry_run(configfiles)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "Shell command: stillroom " in dry.stdout
    # one teacher for every effort: no warning, no teachers table
    assert "mixes teachers" not in dry.stdout and "teacher_tables" not in dry.stdout
    assert {p.name for p in workdir.iterdir()} <= {".snakemake"}
    lint = _snakemake("--lint", cwd=workdir, configfiles=configfiles, snakefile=snakefile)
    assert "Congratulations, your workflow is in a good condition!" in lint.stdout + lint.stderr, (
        lint.stdout[-3000:] + lint.stderr[-3000:]
    )


def test_a_rule_lacking_a_name_of_its_stages_contract_is_refused_at_dag_build(tmp_path):
    """A rule's shell line is generated from its stage's contract (stages/contract.py): a rule that
    does not declare an input its line takes stops the dry run, naming the rule and the input."""
    (tmp_path / "config").symlink_to(REPO / "config")  # the default config's benchmark files
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(
        f'include: "{REPO / "rules" / "common.smk"}"\n\n'
        "rule merge:\n"
        '    input: base="b"\n    output: model="m"\n    params: stage_params="{}"\n'
        '    log: "l"\n    shell: stillroom_cli("merge")\n\n'
        "check_stage_rules()\n"
    )
    proc = _snakemake("-n", cwd=tmp_path, snakefile=snakefile)
    assert proc.returncode != 0
    assert (
        "the shell line of rule merge, from the contract of stage merge "
        "(stillroom/stages/contract.py), takes input.tuned, which the rule does not declare"
    ) in proc.stdout + proc.stderr


def test_a_broken_config_stops_the_dry_run_naming_the_key(tmp_path):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["eval"]["backend"] = {"backend": "openai", "base_ur": "http://localhost:1/v1"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    proc = _snakemake("-n", "--cores", "1", cwd=tmp_path, configfiles=[bad])
    out = proc.stdout + proc.stderr  # a dry run logs to stdout
    assert proc.returncode != 0
    assert "eval.backend: unknown key 'base_ur' (did you mean 'base_url'?)" in out
    assert "Traceback" not in out


def test_a_duplicated_key_in_a_config_file_names_the_file_and_line(tmp_path):
    text = (
        (REPO / "config" / "config.yaml").read_text().replace("seed: 1234", "seed: 1234\nseed: 7")
    )
    dup = tmp_path / "dup.yaml"
    dup.write_text(text)
    proc = _snakemake("-n", "--cores", "1", cwd=tmp_path, configfiles=[dup])
    assert proc.returncode != 0
    line = text.splitlines().index("seed: 7") + 1
    message = f"{dup}:{line}: key 'seed' is given twice (first on line {line - 1})"
    assert message in proc.stdout + proc.stderr


def test_a_config_with_merge_keys_is_read_alike_by_the_cli_and_a_dry_run(tmp_path, capsys):
    # The strict loader built `<<` as a key and refused it; Snakemake's loader merges it.
    default = (REPO / "config" / "config.yaml").read_text()
    block = (
        "  budget_force:          # accuracy against thinking budget: thinking closed at B "
        "tokens, then a short answer\n"
        "    budgets: [16, 48]\n    answer_tokens: 24\n    models: [sft]\n"
        "    benchmarks: [heldout]\n"
        "  per_effort:            # the fine-tune at each effort it was trained with, against "
        "medium\n    models: [sft]\n    benchmarks: [heldout]\n    reference: medium\n"
    )
    assert block in default
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        default.replace(
            block,
            "  budget_force:\n"
            "    <<: &focus {models: [sft], benchmarks: [tinyifeval]}\n"
            "    budgets: [16, 48]\n    answer_tokens: 24\n"
            "    benchmarks: [heldout]   # overrides the merged one\n"
            "  per_effort:\n    <<: *focus\n    benchmarks: [heldout]\n    reference: medium\n",
        )
    )
    assert cli.main(["config", str(merged), "--root", str(REPO)]) in (0, None)
    printed = json.loads(capsys.readouterr().out)
    assert printed == resolve(yaml.safe_load(default), REPO)
    assert printed["eval"]["per_effort"]["models"] == ["sft"]  # from the merge
    dry = _snakemake("-n", "--cores", "1", cwd=tmp_path, configfiles=[merged])
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "evaluate_budget" in dry.stdout  # the merged section's jobs are planned


def _shell_params(dry: str, stage: str) -> list[dict]:
    """The --params of every planned job of CLI stage ``stage`` in a dry run's -p output."""
    return [
        json.loads(m.group(1)) for m in re.finditer(rf"stillroom {stage} .*?--params '(.*?)'", dry)
    ]


def test_odd_merge_ratios_are_planned_end_to_end_with_their_exact_floats(tmp_path):
    """Ratios Python writes with an exponent or many digits: every merge, its evaluations and
    the tables are scheduled, and each job's params carry the exact float of its identity."""
    ratios = [1e-05, 0.125, 0.3333333]
    overlay = tmp_path / "ratios.yaml"
    overlay.write_text(yaml.safe_dump({"merge": {"ratios": ratios}}))
    dry = _snakemake(
        "-n",
        "-p",
        "--cores",
        "1",
        cwd=tmp_path,
        configfiles=[REPO / "config" / "config.yaml", overlay],
    )
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    out = dry.stdout
    names = [f"merge-{r!r}" for r in ratios]
    assert names == ["merge-1e-05", "merge-0.125", "merge-0.3333333"]
    merges = {
        m.group(1): json.loads(m.group(2))["ratio"]
        for m in re.finditer(r"--out-model \S+/ckpt/(merge-\S+) .*?--params '(.*?)'", out)
    }
    assert merges == dict(zip(names, ratios, strict=True))
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    benchmarks = config["eval"]["benchmarks"] + [config["merge"]["select_on"]]
    for name in names:
        for bench in benchmarks:
            assert f"--out-samples results/tiny/eval/{name}/{bench}/samples.jsonl" in out
    (select,) = _shell_params(out, "select_merge")
    assert select["ratios"] == dict(zip(names, ratios, strict=True))
    tables = _shell_params(out, "tables")
    assert len(tables) == len(config["eval"]["benchmarks"])
    for p in tables:
        assert "base" not in p and "tuned" not in p  # the references come from the identities
        merge_ids = [m for m in p["models"] if m["kind"] == "merge"]
        assert [(m["name"], m["ratio"]) for m in merge_ids] == list(zip(names, ratios, strict=True))


def test_the_snakefile_needs_stillroom_on_path(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(tmp_path),
            "-n",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": os.defpath},
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "`stillroom` is not on PATH" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_student_whose_template_cannot_be_marked_is_refused_at_dag_build(tmp_path):
    """A local pretrained student is checked while the workflow is parsed; a configured training
    template reaches the train job as an input."""
    from transformers import Qwen3Config

    from stillroom.runtime.student import CHAT_TEMPLATE, train_tokenizer

    tokenizer = tmp_path / "student"
    tok = train_tokenizer(["What is 2 + 5?"] * 20, tokenizer, vocab_size=300, min_frequency=2)
    tok.chat_template = CHAT_TEMPLATE.replace("{% generation %}", "").replace(
        "{% endgeneration %}", ""
    )
    tok.save_pretrained(tokenizer)
    # a model directory (its config; no weights are read while the DAG is built)
    Qwen3Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
    ).save_pretrained(tokenizer)  # fmt: skip
    overlay = tmp_path / "student.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {"student": {"pretrained": str(tokenizer), "tokenizer": None, "model": None}}
        )
    )
    refused = _snakemake("-n", cwd=tmp_path, configfiles=[REPO / "config" / "config.yaml", overlay])
    assert refused.returncode != 0
    assert "student.pretrained" in refused.stdout + refused.stderr
    assert "train.chat_template" in refused.stdout + refused.stderr

    (tmp_path / "train.jinja").write_text(CHAT_TEMPLATE)
    overlay.write_text(
        yaml.safe_dump(
            {
                "student": {"pretrained": str(tokenizer), "tokenizer": None, "model": None},
                "train": {"chat_template": str(tmp_path / "train.jinja")},
            }
        )
    )
    plan = _snakemake(
        "-n",
        "-p",
        "results/tiny/ckpt/sft",
        cwd=tmp_path,
        configfiles=[REPO / "config" / "config.yaml", overlay],
    )
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    assert f"--chat-template={tmp_path / 'train.jinja'}" in plan.stdout


def _mixed_config(tmp_path, config):
    """``config`` with high generated by a second (procedural, wordier) teacher."""
    config["teachers"]["verbose"] = {"backend": "procedural", "detail": {"high": 3}}
    config["generation"]["effort_teachers"] = {"high": "verbose"}
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_a_config_mixing_teachers_is_warned_once_and_gets_the_teachers_table(tmp_path):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    mixed = _mixed_config(tmp_path, config)
    dry = _snakemake("-n", "-p", "--cores", "2", cwd=tmp_path, configfiles=[mixed])
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    out = dry.stdout + dry.stderr
    warning = (
        "WARNING: generation mixes teachers across efforts (low, medium by procedural; high by "
        "verbose)."
    )
    assert out.count(warning) == 1 and out.count("mixes teachers") == 1
    assert "~35% longer" in out and "results/tiny/tables/teachers.md compares" in out
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.stdout, re.M))
    # high by its own teacher (its job's shape from the {teacher} wildcard), on both shards
    assert jobs["generate"] == "6" and jobs["teacher_tables"] == "1"
    assert "results/tiny/gen/verbose/high/shard-00001.jsonl" in dry.stdout
    # each job's params name the teacher of its file
    commands = re.findall(
        r"stillroom generate .*--out-samples (\S+) .*--params '(.*?)'", dry.stdout
    )
    assert len(commands) == 6
    assert all(
        (json.loads(p)["teacher"] == "verbose") == ("/verbose/" in out) for out, p in commands
    )
    assert "results/tiny/tables/teachers.md" in re.search(r"rule all:\n\s+input: (.*)", out)[1]
    lint = _snakemake("--lint", cwd=tmp_path, configfiles=[mixed])
    assert "Congratulations, your workflow is in a good condition!" in lint.stdout + lint.stderr, (
        lint.stdout[-3000:] + lint.stderr[-3000:]
    )


@pytest.mark.slow
def test_the_teachers_table_is_built_from_the_graded_shards(tmp_path, small_cfg):
    """The small config with low on one shard by a wordier teacher: the table covers that shard's
    prompts, medium (the reference) cut down to them."""
    small_cfg["teachers"]["verbose"] = {"backend": "procedural", "detail": {"low": 3}}
    small_cfg["generation"].update(effort_teachers={"low": "verbose"}, effort_shards={"low": 1})
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump(small_cfg))
    target = "results/small/tables/teachers.md"
    proc = _snakemake("--cores", "2", target, cwd=tmp_path, configfiles=[mixed])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = (tmp_path / target).read_text().splitlines()
    assert rows[4].startswith("| procedural | medium |") and "— (reference)" in rows[4]
    assert rows[5].startswith("| verbose | low |") and "| medium | +" in rows[5]
    table = list(csv.DictReader((tmp_path / "results/small/tables/teachers.csv").open()))
    medium, low = table
    assert int(medium["prompts"]) > int(medium["prompts_shared"]) == int(low["prompts"])
    assert float(low["token_ratio"]) > 1  # full detail at low: longer than medium's
    prov = json.loads((tmp_path / f"{target}.prov.json").read_text())
    assert {i["path"] for i in prov["inputs"]["graded"]} == {
        "results/small/graded/verbose/low/shard-00000.jsonl",
        "results/small/graded/procedural/medium/shard-00000.jsonl",
        "results/small/graded/procedural/medium/shard-00001.jsonl",
    }
