"""The bill before the run: the estimate of every GPU stage from the config alone, offline; the real
recipe's lands near the reported bill; missing or bad figures are errors naming their key."""

from __future__ import annotations

import copy
import json
import time

import pytest
import yaml

from stillroom import cli
from stillroom.config import ConfigError, load_yaml, merge_configs, resolve
from stillroom.estimate import EstimateError, count_rows, makespan, markdown, plan

from .conftest import REPO, small_config

DEFAULT = load_yaml(REPO / "config" / "config.yaml")
DISTILL = load_yaml(REPO / "config" / "experiments" / "beam-distill.yaml")


def estimate(config, **figures):
    config = copy.deepcopy(config)
    config.setdefault("cost", {}).setdefault("estimate", {}).update(figures)
    return plan(resolve(config, REPO), REPO)


def rows(p, rule):
    return [r for r in p.rows if r.rule == rule]


def test_the_real_recipe_lands_near_the_reported_bill():
    t0 = time.monotonic()
    p = estimate(DISTILL)
    assert time.monotonic() - t0 < 2  # offline and fast: nothing loaded from the hub
    # The reported bill: ~$140 self-hosted generation at medium, ~$70 for the other efforts,
    # ~$107 of training ($67 + $40), ~$320 for generation and training.
    medium = rows(p, "generate")
    assert [r.effort for r in medium] == ["medium"]
    assert 120 <= medium[0].usd <= 160
    others = rows(p, "generate_low_high_xhigh")
    assert [r.effort for r in others] == ["low", "high", "xhigh"]
    assert 60 <= sum(r.usd for r in others) <= 100
    assert 90 <= p.phases["training"]["usd"] <= 125
    assert 290 <= p.total["generation_training_usd"] <= 360
    # the medium stage is the paper's: two epochs on medium in 2 h 10 min on 4 GPUs
    stage = rows(p, "train")[0]
    assert stage.gpus_per_job == 4 and 2.0 <= stage.wall_s / 3600 <= 2.4
    # every stage, with the jobs the DAG has (tests/workflow/test_experiments.py)
    jobs = {rule: sum(r.jobs for r in rows(p, rule)) for rule in p.by_rule()}
    assert jobs["generate"] == 62 and {r.jobs for r in others} == {20}
    assert jobs["train"] == 2 and [r.label.split(":")[0] for r in rows(p, "train")] == [
        "medium",
        "efforts",
    ]
    assert jobs["merge"] == 3
    assert jobs["evaluate"] == 5 * 6 + 3
    assert jobs["evaluate_budget"] == 3 * 2 * 4 and jobs["evaluate_effort"] == 2 * 2 * 4
    assert p.phases["generation"]["jobs"] == 62 + 20
    assert set(p.phases) == {"generation", "training", "merge", "evaluation"}
    assert p.inputs["pool_prompts"] == 45_000 + 17_000 - 300  # less the dev split
    assert p.inputs["benchmark_problems"]["dev"] == 300
    # the self-hosted teacher is billed by GPU-hours only (2 GPUs, --tp 2)
    assert medium[0].gpus_per_job == 2 and medium[0].api_usd == 0 and not p.notes
    table = markdown(p)
    for rule in ("generate_low_high_xhigh", "train", "merge", "evaluate_budget", "evaluate_effort"):
        assert f"| {rule} |" in table
    assert "**Estimated total:" in table


def test_the_default_config_is_estimated_from_its_local_files():
    p = estimate(DEFAULT)
    shipped = {
        b: len((REPO / path).read_text().splitlines()) for b, path in DEFAULT["benchmarks"].items()
    }
    assert p.inputs["benchmark_problems"] == {
        "heldout": 150,
        "tinyifeval": shipped["tinyifeval"],
        "tinycode": shipped["tinycode"],
        "dev": 60,
    }
    assert p.inputs["pool_prompts"] == 1800 + 900 - 150 - 60  # echo rows are decontaminated away
    gen = {r.effort: r for r in rows(p, "generate")}
    figures = DEFAULT["cost"]["estimate"]["teacher_output_tokens"]
    for effort, r in gen.items():
        assert r.tokens == pytest.approx(2490 * 2 * figures[effort])
        assert r.gpus_per_job == 0 and r.jobs == 2  # the procedural teacher needs no GPU
    # two samples per prompt: a prompt is kept when one of them is correct
    assert p.inputs["dataset_rows"]["low"] == round(2490 * (1 - 0.3**2))
    assert p.total["usd"] == 0  # no rate configured


def test_the_kernel_miniature_counts_its_generated_family_and_training_split():
    p = estimate(load_yaml(REPO / "config" / "experiments" / "autotriton-tiny.yaml"))
    # 13 ops at 3 shapes, 9 held out; the train split is the pool the models trained on
    assert p.inputs["pool_prompts"] == 39 - 9
    assert p.inputs["benchmark_problems"] == {"train": 30, "heldout": 9}


def test_a_derived_config_with_fewer_efforts_uses_the_figures_it_needs():
    p = estimate(small_config())  # efforts low and medium; the default's figures name high too
    assert [r.effort for r in rows(p, "generate")] == ["low", "medium"]
    pool = 240 + 120 - 24 - 12  # one sample per prompt: kept when it is correct
    assert p.inputs["dataset_rows"] == {"low": round(pool * 0.7), "medium": round(pool * 0.8)}


def test_missing_sizes_of_hub_datasets_are_named_all_at_once():
    config = copy.deepcopy(DISTILL)
    del config["cost"]["estimate"]["benchmark_sizes"]
    del config["sources"][1]["limit"]
    with pytest.raises(EstimateError) as err:
        plan(resolve(config, REPO), REPO)
    msg = str(err.value)
    assert "cost.estimate.source_rows.openscience: sources.1" in msg
    for name in ("aime24", "aime25", "math500", "gpqa", "ifeval", "humaneval"):
        assert f"cost.estimate.benchmark_sizes.{name}: benchmarks.{name}" in msg
    # given, they are used, and a limit caps them
    config["cost"]["estimate"]["source_rows"] = {"openscience": 5000}
    config["cost"]["estimate"]["benchmark_sizes"] = {
        "aime24": 30,
        "aime25": 30,
        "math500": 500,
        "gpqa": 198,
        "ifeval": 541,
        "humaneval": 164,
    }
    config["benchmarks"]["math500"]["limit"] = 100
    p = plan(resolve(config, REPO), REPO)
    assert p.inputs["pool_prompts"] == 45_000 + 5000 - 300
    assert p.inputs["benchmark_problems"]["math500"] == 100


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        (
            {"teacher_tokens_per_s": 0},
            "cost.estimate.teacher_tokens_per_s: Input should be greater",
        ),
        ({"teacher_output_tokens": {"medium": 2000}}, "no figure for effort low, high, xhigh"),
        (
            {"eval_output_tokens": {"aime24": 1}},
            "cost.estimate.eval_output_tokens: no figure for benchmark aime25",
        ),
        ({"correct_fraction": 1.5}, "cost.estimate.correct_fraction: Input should be less"),
        ({"benchmark_sizes": {"aime26": 30}}, "cost.estimate.benchmark_sizes.aime26"),
        ({"source_rows": {"nope": 5}}, "cost.estimate.source_rows.nope: not a dataset source"),
        ({"parallel_jobs": 0}, "cost.estimate.parallel_jobs"),
        ({"teacher_token_per_s": 1}, "(did you mean 'teacher_tokens_per_s'?)"),
    ],
)
def test_bad_figures_are_refused_naming_the_key(figures, expected):
    with pytest.raises(ConfigError) as err:
        estimate(DISTILL, **figures)
    assert expected in str(err.value), str(err.value)


def test_fewer_jobs_at_once_take_longer_and_cost_the_same():
    free, four = estimate(DISTILL), estimate(DISTILL, parallel_jobs=4)
    assert four.total["usd"] == pytest.approx(free.total["usd"])
    assert four.phases["generation"]["wall_s"] > 10 * free.phases["generation"]["wall_s"]
    # training stages run one after another, whatever the slots
    assert four.phases["training"]["wall_s"] == free.phases["training"]["wall_s"]
    assert makespan([2, 3, 4, 3], 2) == 6 and makespan([5, 1], None) == 5
    assert makespan([], 3) == 0


def test_budget_forcing_and_efforts_shape_the_evaluation_tokens():
    p = estimate(DISTILL)
    config = resolve(DISTILL, REPO)
    figures = config["cost"]["estimate"]
    aime = figures["eval_output_tokens"]["aime24"]
    budgets, answer = config["eval"]["budget_force"]["budgets"], 1024
    per_sample = [min(aime, b + answer) for b in budgets]  # thinking closed at each budget
    (budget,) = rows(p, "evaluate_budget")
    assert budget.tokens == pytest.approx(3 * 2 * 30 * 8 * sum(per_sample))
    teacher = figures["teacher_output_tokens"]
    scale = sum(teacher[e] / teacher["medium"] for e in teacher)  # the teacher's spacing
    (effort,) = rows(p, "evaluate_effort")
    assert effort.tokens == pytest.approx(2 * 2 * 30 * 8 * aime * scale)


def test_an_api_teacher_is_billed_by_its_price_and_waits_for_its_daily_budget():
    config = copy.deepcopy(DISTILL)
    config["generation"]["teacher"] = "beam-api"
    config["teachers"]["beam-api"]["price"] = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}
    p = estimate(config)
    (medium,) = [r for r in p.rows if r.effort == "medium"]
    assert medium.gpus_per_job == 0 and medium.gpu_usd == 0
    assert medium.api_usd == pytest.approx((medium.input_tokens * 1.0 + medium.tokens * 4.0) / 1e6)
    assert medium.input_tokens == pytest.approx(61_700 * 150)
    out = sum(r.tokens for r in p.rows if r.phase == "generation")
    days = -(-out // 50_000_000)  # the recipe's 50M output tokens a day
    assert p.phases["generation"]["wall_s"] == (days - 1) * 86400
    assert any("beam-api.budget" in n for n in p.notes)


def test_a_self_hosted_teacher_with_a_price_is_flagged_as_charged_twice():
    config = copy.deepcopy(DISTILL)
    config["teachers"]["beam-sglang"]["price"] = {"output_per_mtok": 0.5}
    p = estimate(config)
    assert any("charges both" in n for n in p.notes)


def test_max_steps_caps_the_tokens_trained():
    config = copy.deepcopy(DISTILL)
    config["train"]["max_steps"] = 10
    p = estimate(config)
    # batch 1 x grad_accum 16 x 4 processes x 16k packed tokens a step
    assert [r.tokens for r in rows(p, "train")] == [10 * 16 * 4 * 16384] * 2


def test_an_overlay_changes_the_training_layout():
    overlay = load_yaml(REPO / "config" / "experiments" / "beam-lora-fsdp.yaml")
    p = plan(resolve(merge_configs(DISTILL, overlay), REPO), REPO)
    assert {r.gpus_per_job for r in rows(p, "train")} == {16}  # 2 nodes x 8


def test_count_rows_reads_local_files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n\n{"x": 2}\n')
    (tmp_path / "b.csv").write_text("x,y\n1,2\n3,4\n5,6\n")
    (tmp_path / "c.json").write_text(json.dumps([{"x": 1}, {"x": 2}]))
    assert [count_rows(tmp_path / n) for n in ("a.jsonl", "b.csv", "c.json")] == [2, 3, 2]


def test_the_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bill.json"
    recipe = REPO / "config" / "experiments" / "beam-distill.yaml"
    rc = cli.main(
        ["estimate", "--configfile", str(recipe), "--root", str(REPO), "--out-json", str(out)]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert (
        printed.startswith("### Estimate: beam-distill") and "| generation | generate |" in printed
    )
    data = json.loads(out.read_text())
    assert data["total"]["usd"] == pytest.approx(estimate(DISTILL).total["usd"])
    assert {r["rule"] for r in data["rows"]} >= {"generate", "train", "merge", "evaluate"}
    # with no config file: the embedded default
    assert cli.main(["estimate", "--root", str(REPO)]) == 0
    assert "### Estimate: tiny" in capsys.readouterr().out


def test_the_cli_names_a_missing_figure(tmp_path, capsys):
    config = copy.deepcopy(DISTILL)
    del config["cost"]["estimate"]["benchmark_sizes"]["gpqa"]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["estimate", "--configfile", str(path), "--root", str(REPO)]) == 2
    assert "cost.estimate.benchmark_sizes.gpqa" in capsys.readouterr().err


def test_kernel_problems_of_a_jsonl_file_are_counted_by_row(tmp_path):
    config = load_yaml(REPO / "config" / "experiments" / "autotriton-8b.yaml")
    path = tmp_path / "level1.jsonl"
    path.write_text('{"code": "..."}\n' * 7)
    config["sources"] = [{"name": "kb", "kind": "kernels", "path": str(path)}]
    assert estimate(config).inputs["pool_prompts"] == 7  # heldout.size 0: evaluation is KernelBench
