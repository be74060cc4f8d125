"""The workflow's plan, built from the typed experiment as rules/common.smk builds it: every rule's
paths and params, without Snakemake."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from stillroom.config import Experiment, merge_configs, resolve
from stillroom.plan.dag import Plan, model_source, one_of
from stillroom.plan.paths import EVAL_RUNS, PATHS, fill
from stillroom.stages import merge, train

from ..conftest import REPO, default_config, recipe_files

RECIPES = sorted((REPO / "config" / "experiments").glob("*.yaml"))
ODD = [1e-05, 0.125, 0.3333333]


def plan_of(config: dict) -> Plan:
    resolved = resolve(config, REPO)
    return Plan(Experiment.parse(resolved), resolved, REPO)


def recipe_plan(recipe: Path) -> Plan:
    config: dict = {}
    for path in recipe_files(recipe):
        config = merge_configs(config, yaml.safe_load(path.read_text()))
    # typed only: a smoke twin's stand-in models are built by `stillroom stand-ins`, before a run,
    # and resolve checks that they are there
    typed = Experiment.parse(config).dump()
    return Plan(Experiment.parse(typed), typed, REPO)


def with_ratios(ratios: list[float]) -> Plan:
    return plan_of(merge_configs(default_config(), {"merge": {"ratios": ratios}}))


def test_the_default_plan_compares_base_sft_and_the_merges_in_table_order():
    plan = plan_of(default_config())
    assert plan.results == "results/tiny"
    assert plan.models == ["base", "sft", "merge-0.3", "merge-0.5", "merge-0.7"]
    assert [m.kind for m in plan.model_ids] == ["base", "sft", "merge", "merge", "merge"]
    assert plan.graded_models("heldout") == {
        m: f"results/tiny/eval/{m}/heldout/graded.jsonl" for m in plan.models
    }
    assert plan.benchmark_file("heldout") == "results/tiny/pool/heldout.jsonl"
    assert plan.benchmark_file("train") == "results/tiny/pool/decontaminated.jsonl"
    assert plan.benchmark_file("tinycode") == str(REPO / "config/benchmarks/tinycode.jsonl")


def test_odd_ratios_name_their_models_paths_and_params_with_the_exact_floats():
    plan = with_ratios(ODD)
    names = ["merge-1e-05", "merge-0.125", "merge-0.3333333"]
    assert list(plan.merges) == names
    assert [plan.merges[n].ratio for n in names] == ODD
    for name, ratio in zip(names, ODD, strict=True):
        assert json.loads(merge.job_params(plan.experiment, name).as_param())["ratio"] == ratio
        assert plan.cost_artifacts()[name] == f"results/tiny/ckpt/{name}"
        assert f"results/tiny/ckpt/{name}.prov.json" in plan.all_sidecars()
        # evaluated on every reported benchmark and on the dev split the ratio is chosen on
        for bench in ("heldout", "tinyifeval", "tinycode", "dev"):
            assert f"eval-{name}-{bench}" in plan.cost_artifacts()
    assert plan.dev_graded() == {n: f"results/tiny/eval/{n}/dev/graded.jsonl" for n in names}
    select = json.loads(merge.select_job_params(plan.experiment).as_param())
    assert select["ratios"] == dict(zip(names, ODD, strict=True))


def test_the_model_constraint_matches_each_model_name_and_nothing_else():
    plan = with_ratios(ODD)
    pattern = re.compile(one_of(plan.models))
    for name in plan.models:
        assert pattern.fullmatch(name)
    # a dot is a dot: no other ratio, no prefix of one
    for other in ("merge-1e-0", "merge-0x125", "merge-0.12", "merge-0.5", "grpo", "select-x"):
        assert not pattern.fullmatch(other)
    assert not re.compile(one_of([])).fullmatch("")  # no merges: nothing matches


def test_every_effort_is_graded_from_its_teacher_on_its_shards():
    plan = plan_of(default_config())
    graded = plan.graded_shards()
    assert len(graded) == sum(len(plan.shards_of(e)) for e in plan.efforts)
    for e in plan.efforts:
        for s in plan.shards_of(e):
            teacher = plan.effort_teacher[e]
            assert graded[f"{e}-{s}"] == f"results/tiny/graded/{teacher}/{e}/shard-{s}.jsonl"


def test_an_effort_group_writes_one_file_that_each_of_its_efforts_is_graded_from():
    plan = plan_of(
        merge_configs(default_config(), {"generation": {"effort_groups": [["low", "high"]]}})
    )
    group = "results/tiny/gen/procedural/low+high/shard-00001.jsonl"
    assert plan.generated("low", shard="00001") == plan.generated("high", shard="00001") == group
    # an effort alone keeps its own file: its jobs are those of a run without groups
    assert plan.generated("medium", shard="00001") == (
        "results/tiny/gen/procedural/medium/shard-00001.jsonl"
    )
    assert plan.grouped("low") and not plan.grouped("medium")
    assert plan.job_efforts("procedural", "low+high") == ["low", "high"]
    assert re.fullmatch(plan.generation_constraints["efforts"], "low+high")
    assert not re.fullmatch(plan.generation_constraints["efforts"], "low")
    # the ledger charges the group's job once, whichever effort names it
    cost = plan.cost_artifacts()
    assert cost["gen-low-00000"] == cost["gen-high-00000"] != cost["gen-medium-00000"]


def test_training_phases_chain_their_checkpoints_and_adapters_merge_into_them():
    plan = recipe_plan(REPO / "config/experiments/beam-distill-smoke.yaml")
    r = plan.results
    assert plan.phase_suffix == ["-medium", ""]
    assert plan.train_phase("-medium")[1] == f"{r}/ckpt/base"
    phase, start = plan.train_phase("")
    assert phase["name"] == "efforts" and start == f"{r}/ckpt/sft-medium"
    assert plan.phase_name == {"-medium": "medium", "": "efforts"}
    params = json.loads(train.job_params(plan.experiment, "efforts").as_param())
    assert params["distributed"] == phase["distributed"]
    medium = json.loads(train.job_params(plan.experiment, "medium").as_param())
    assert "phases" not in medium and medium["phase"]["name"] == "medium"
    assert medium["epochs"] == plan.experiment.train.phases[0].epochs
    # the ablation's jobs: the section's own, no phase
    assert "phase" not in json.loads(train.job_params(plan.experiment).as_param())
    constraint = re.compile(plan.phase_constraint)
    assert constraint.fullmatch("") and constraint.fullmatch("-medium")
    assert not constraint.fullmatch("-efforts")
    assert plan.adapter_base("sft") == f"{r}/ckpt/sft-medium"
    assert plan.trained == ["sft-medium", "sft"]


def test_an_ablation_trains_one_model_per_selection():
    plan = recipe_plan(REPO / "config/experiments/tiny-select-ablation.yaml")
    selections = plan.ablation
    assert selections and [m.selection for m in plan.model_ids if m.kind == "select"] == selections
    for s in selections:
        assert f"select-{s}" in plan.models
        assert f"{plan.results}/dataset/select-{s}.jsonl.prov.json" in plan.all_sidecars()
        assert plan.adapter_base(f"select-{s}") == f"{plan.results}/ckpt/base"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_plans_sidecars_only_for_its_own_artifacts(recipe):
    plan = recipe_plan(recipe)
    sidecars = plan.all_sidecars()
    assert sidecars and all(s.startswith(f"{plan.results}/") for s in sidecars)
    assert all(s.endswith(".prov.json") for s in sidecars)
    assert len(set(sidecars)) == len(sidecars)
    # every model the tables compare is evaluated on every reported benchmark
    reported = plan.config["eval"]["benchmarks"]
    evaluated = {k for k in plan.cost_artifacts() if k.startswith("eval-")}
    assert {f"eval-{m}-{b}" for m in plan.models for b in reported} <= evaluated
    assert plan.table_benchmarks()["tables"] == reported


def test_a_model_source_is_a_repository_directory_made_absolute_or_a_hub_id(tmp_path):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    assert model_source("models/tiny", tmp_path) == str(tmp_path / "models" / "tiny")
    assert model_source("Qwen/Qwen3-0.6B", tmp_path) == "Qwen/Qwen3-0.6B"
    assert model_source(str(tmp_path / "x"), REPO) == str(tmp_path / "x")


def test_a_path_template_keeps_the_fields_not_given_as_wildcards_and_refuses_unknown_ones():
    assert fill(PATHS["samples"], run=EVAL_RUNS["evaluate_budget"]) == (
        "eval/{model}/{bench}/budget-{budget}/samples.jsonl"
    )
    assert fill(PATHS["generated"], efforts="low") == "gen/{teacher}/low/shard-{shard}.jsonl"
    with pytest.raises(KeyError, match="no field bench"):
        fill(PATHS["pool"], bench="heldout")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_artifact_the_plan_enumerates_is_a_path_of_the_table(recipe):
    plan = recipe_plan(recipe)
    runs = EVAL_RUNS.values()
    templates = {fill(t, run=r) if "{run}" in t else t for t in PATHS.values() for r in runs}
    # a {field} is one path segment or part of one
    patterns = [
        re.compile("[^/]+".join(map(re.escape, re.split(r"\{\w+\}", f"{plan.results}/{t}"))))
        for t in templates
    ]
    for sidecar in plan.all_sidecars():
        artifact = sidecar.removesuffix(".prov.json")
        assert any(p.fullmatch(artifact) for p in patterns), artifact
