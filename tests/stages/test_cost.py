"""The cost ledger from provenance: API tokens x price per teacher and effort, GPU-hours per
rule."""

import csv
import json

from stillroom.config import Experiment, load_yaml, resolve
from stillroom.plan.cluster import stage_gpus
from stillroom.plan.estimate import bill
from stillroom.provenance.sidecars import Job, write_sidecars
from stillroom.stages.cost import job_params, ledger, parse_sacct, run

from ..conftest import REPO, default_config


def artifact(tmp_path, name, *, stage, rule, params, metrics, monkeypatch, job=None):
    path = tmp_path / name
    path.write_text(name)
    if job:
        monkeypatch.setenv("SLURM_JOB_ID", job)
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    write_sidecars(
        {"out": path},
        {},
        stage=stage,
        params=params,
        started=f"2026-01-01T00:00:0{len(name) % 10}",
        metrics=metrics,
        job=Job(rule=rule),
    )
    return str(path)


def test_parse_sacct():
    assert parse_sacct("7200|billing=64,cpu=64,gres/gpu=8,mem=1T,node=1\n") == (7200.0, 8)
    assert parse_sacct("60|cpu=2,gres/gpu:b200=4\n") == (60.0, 4)
    assert parse_sacct("30|cpu=2,mem=4G\n") == (30.0, 0)
    assert parse_sacct("") is None


def test_ledger_sums_api_cost_per_teacher_and_effort_and_gpu_hours_per_rule(tmp_path, monkeypatch):
    gen = {"prompt_tokens": 1000, "completion_tokens": 4000, "cost_usd": 2.0, "wall_s": 100}
    a = artifact(
        tmp_path,
        "g1",
        stage="generate",
        rule="generate",
        params={"teacher": "beam", "effort": "low"},
        metrics=gen,
        monkeypatch=monkeypatch,
    )
    b = artifact(
        tmp_path,
        "g22",
        stage="generate",
        rule="generate",
        params={"teacher": "beam", "effort": "low"},
        metrics=gen,
        monkeypatch=monkeypatch,
    )
    grouped = {
        **gen,
        "per_effort": {
            "high": {"prompt_tokens": 10, "completion_tokens": 20, "cost_usd": 0.5},
            "xhigh": {"prompt_tokens": 30, "completion_tokens": 40, "cost_usd": 1.5},
        },
    }
    c = artifact(
        tmp_path,
        "g333",
        stage="generate",
        rule="generate",
        params={"teacher": "api", "efforts": ["high", "xhigh"]},
        metrics=grouped,
        monkeypatch=monkeypatch,
    )
    t = artifact(
        tmp_path,
        "train",
        stage="train",
        rule="train",
        params={},
        metrics={"wall_s": 9999},
        monkeypatch=monkeypatch,
        job="4242",
    )
    rows = ledger(
        {"a": a, "b": b, "c": c, "t": t},
        # another teacher's generation jobs have their GPUs under generate-<teacher>
        {"gpu_hour_usd": 2.0, "gpus": {"generate": 2, "generate-api": 0}},
        usage=lambda job: (3600.0, 4) if job == "4242" else None,
    )
    api = {(r["teacher"], r["effort"]): r for r in rows["api"]}
    assert (
        api[("beam", "low")]["cost_usd"] == 4.0
        and api[("beam", "low")]["completion_tokens"] == 8000
    )
    assert api[("api", "xhigh")]["cost_usd"] == 1.5 and api[("api", "high")]["jobs"] == 1
    gpu = {r["rule"]: r for r in rows["gpu"]}
    # two jobs of beam on 2 GPUs each and one of api on none, all of rule generate
    assert (
        gpu["generate"]["jobs"] == 3
        and gpu["generate"]["gpu_hours"] == round(2 * 100 * 2 / 3600, 4)
        and gpu["generate"]["source"] == "wall time"
    )
    assert (
        gpu["train"]["gpu_hours"] == 4.0
        and gpu["train"]["cost_usd"] == 8.0
        and gpu["train"]["source"] == "sacct"
    )


def test_jobs_started_in_the_same_millisecond_are_two_jobs_and_one_jobs_outputs_one(tmp_path):
    """Two evaluations of one rule started in the same millisecond (seen in CI: the ledger counted
    9 evaluate jobs of 10, and their tokens short) are charged both; one job writing two outputs is
    charged once."""
    started = "2026-12-06T08:00:03.032+00:00"
    arts = {}
    for name in ("heldout", "tinycode"):
        path = tmp_path / name
        path.write_text(name)
        write_sidecars(
            {"samples": path},
            {},
            stage="evaluate",
            params={},
            started=started,
            metrics={"completion_tokens": 100, "wall_s": 36},
            job=Job(rule="evaluate"),
        )
        arts[name] = str(path)
    outs = {n: tmp_path / f"pair-{n}" for n in ("a", "b")}
    for path in outs.values():
        path.write_text(path.name)
    write_sidecars(
        outs,
        {},
        stage="evaluate",
        params={},
        started=started,
        metrics={"completion_tokens": 7, "wall_s": 36},
        job=Job(rule="evaluate"),
    )
    arts |= {f"pair-{n}": str(p) for n, p in outs.items()}
    (row,) = ledger(arts, {"gpus": {"evaluate": 1}}, usage=lambda job: None)["gpu"]
    assert (row["jobs"], row["tokens"], row["gpu_hours"]) == (3, 207, 0.03)


def test_each_rule_is_charged_its_gpu_types_price_and_a_phase_its_own_gpus(tmp_path, monkeypatch):
    """The teacher's B300s at their price, training at the B200's; a training phase with a
    layout of its own (train-<phase>) charged its own GPUs when sacct has no answer."""
    wall = {"wall_s": 3600}
    arts = {
        "g": artifact(
            tmp_path,
            "g1",
            stage="generate",
            rule="generate",
            params={"teacher": "beam", "effort": "medium"},
            metrics=wall,
            monkeypatch=monkeypatch,
        ),
        **{
            name: artifact(
                tmp_path,
                name,
                stage="train",
                rule="train",
                params={"phase": {"name": name, "epochs": 1}},
                metrics=wall,
                monkeypatch=monkeypatch,
            )
            for name in ("medium", "efforts")
        },
    }
    cost = {
        "gpu_types": {
            "b200": {"usd_per_hour": 7.6, "memory_gb": 180},
            "b300": {"usd_per_hour": 8.5, "memory_gb": 288},
        },
        "gpu_type": "b200",
        "gpu_type_by_rule": {"generate": "b300"},
        "gpus": {"generate": 2, "train": 4, "train-efforts": 8},
    }
    gpu = {r["rule"]: r for r in ledger(arts, cost, usage=lambda job: None)["gpu"]}
    assert (gpu["generate"]["gpu_hours"], gpu["generate"]["cost_usd"]) == (2.0, 17.0)
    assert (gpu["train"]["gpu_hours"], gpu["train"]["cost_usd"]) == (12.0, round(12 * 7.6, 2))


def test_run_writes_markdown_and_csv_with_totals(tmp_path, monkeypatch):
    a = artifact(
        tmp_path,
        "g1",
        stage="generate",
        rule="generate",
        params={"teacher": "api", "effort": "medium"},
        metrics={"prompt_tokens": 5, "completion_tokens": 7, "cost_usd": 1.25, "wall_s": 3600},
        monkeypatch=monkeypatch,
    )
    m = run(
        artifacts={"a": a},
        out_markdown=str(tmp_path / "c.md"),
        out_csv=str(tmp_path / "c.csv"),
        params={"gpu_hour_usd": 3.0, "gpus": {"generate": 1}},
        log=lambda _: None,
    )
    assert m == {"api_usd": 1.25, "gpu_usd": 3.0}
    assert "**Total: $4.25**" in (tmp_path / "c.md").read_text()
    assert (tmp_path / "c.csv").read_text().splitlines()[-1].startswith("total,")


def _estimated_config():
    """The embedded default resolved, its local benchmark files resolved as the rule passes them."""
    config = resolve(load_yaml(REPO / "config" / "config.yaml"), REPO)
    config["benchmarks"] = {k: str(REPO / v) for k, v in config["benchmarks"].items()}
    return config


def test_the_ledger_states_how_far_the_estimate_was_off(tmp_path, monkeypatch):
    config = _estimated_config()
    # charged at the ledger's rate and GPUs, as the rule passes them (from the same config)
    config["cost"].update(gpu_hour_usd=100.0, gpus={"train": 1, "generate": 0})
    estimated = bill(config)
    est_gen = estimated.by_teacher_effort()[("procedural", "medium")]["output_tokens"]
    est_train = estimated.by_rule()["train"]
    gen = artifact(
        tmp_path,
        "g1",
        stage="generate",
        rule="generate",
        params={"teacher": "procedural", "effort": "medium"},
        # 10% more output tokens than estimated
        metrics={"completion_tokens": round(est_gen * 1.1), "cost_usd": 0.0, "wall_s": 1},
        monkeypatch=monkeypatch,
    )
    train = artifact(
        tmp_path,
        "train",
        stage="train",
        rule="train",
        params={"epochs": 2.0, "max_steps": -1},
        # the dataset's tokens, trained twice: half the estimate; twice the estimated GPU time
        metrics={
            "total_tokens": round(est_train["tokens"] / 4),
            "wall_s": est_train["gpu_hours"] * 3600 * 2,
        },
        monkeypatch=monkeypatch,
    )
    params = {**{k: config["cost"][k] for k in ("gpu_hour_usd", "gpus")}, "config": config}
    m = run(
        artifacts={"g": gen, "t": train},
        out_markdown=str(tmp_path / "c.md"),
        out_csv=str(tmp_path / "c.csv"),
        params=params,
        log=lambda _: None,
    )
    md = (tmp_path / "c.md").read_text()
    assert "est. output tokens | est. API $ |" in md and "est. GPU-hours" in md
    (gen_line,) = [line for line in md.splitlines() if line.startswith("| procedural | medium")]
    assert f"{round(est_gen):,} (+10%, ×1.10)" in gen_line
    (train_line,) = [line for line in md.splitlines() if line.startswith("| train |")]
    assert "(-50%, ×0.50)" in train_line  # tokens
    assert train_line.count("(+100%, ×2.00)") == 2  # GPU-hours and dollars
    assert "No estimate" not in md
    # the estimate of the rows the ledger has (the generation is the procedural teacher's: free)
    assert m["estimated_usd"] == round(est_train["gpu_usd"], 2) > 0
    assert f"estimated before the run: ${m['estimated_usd']:,.2f} (+100%, ×2.00)" in md
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    by_name = {r["name"]: r for r in rows}
    assert float(by_name["procedural"]["est_tokens"]) == round(est_gen)
    assert float(by_name["train"]["tokens"]) == round(est_train["tokens"] / 4) * 2
    assert float(by_name["train"]["est_gpu_hours"]) == round(est_train["gpu_hours"], 4)


def test_the_ledger_without_the_figures_it_needs_says_why(tmp_path, monkeypatch):
    config = _estimated_config()
    config["benchmarks"]["hub"] = {"path": "org/bench"}
    config["eval"]["benchmarks"] = ["hub"]
    config["eval"]["budget_force"]["benchmarks"] = ["hub"]
    config["eval"]["per_effort"]["benchmarks"] = ["hub"]
    gen = artifact(
        tmp_path,
        "g1",
        stage="generate",
        rule="generate",
        params={"teacher": "procedural", "effort": "medium"},
        metrics={"completion_tokens": 10, "cost_usd": 0.0, "wall_s": 1},
        monkeypatch=monkeypatch,
    )
    run(
        artifacts={"g": gen},
        out_markdown=str(tmp_path / "c.md"),
        out_csv=str(tmp_path / "c.csv"),
        params={"config": config},
        log=lambda _: None,
    )
    md = (tmp_path / "c.md").read_text()
    assert "No estimate: cannot estimate:" in md and "cost.estimate.benchmark_sizes.hub" in md
    assert "est." not in md.split("No estimate")[0]  # the tables as without an estimate


def test_tokens_trained_for_max_steps_are_counted_not_timed(tmp_path, monkeypatch):
    """With max_steps the ledger charges the tokens the trainer counted: two runs of the same job
    timed differently (a rate and a time, each rounded) bill the same tokens."""
    rows = []
    for seconds, rate in ((34.907, 99.5), (32.109, 108.2)):  # two runs of one job, as measured
        train = artifact(
            tmp_path,
            f"train-{seconds}",
            stage="train",
            rule="train",
            params={"epochs": 2.0, "max_steps": 8},
            metrics={
                "total_tokens": 51652,
                "tokens_seen": 3473,
                "train_seconds": seconds,
                "tokens_per_second": rate,
                "wall_s": 75,
            },
            monkeypatch=monkeypatch,
        )
        run(
            artifacts={"t": train},
            out_markdown=str(tmp_path / "c.md"),
            out_csv=str(tmp_path / "c.csv"),
            params={"gpu_hour_usd": 1.0, "gpus": {"train": 1}},
            log=lambda _: None,
        )
        rows.append({r["name"]: r for r in csv.DictReader((tmp_path / "c.csv").open())})
    assert rows[0]["train"]["tokens"] == rows[1]["train"]["tokens"] == "3473"


def test_the_cost_job_s_params_name_no_checkout_and_charge_each_rule_s_gpus():
    config = resolve(default_config(), REPO)
    exp = Experiment.parse(config)
    text = job_params(exp).as_param()
    job = json.loads(text)
    # the ledger's params name no checkout: its job resolves them against the workflow's directory
    assert job["config"]["benchmarks"]["tinycode"] == "config/benchmarks/tinycode.jsonl"
    assert str(REPO) not in text
    # sorted keys: the same params give the same command, so only real changes rerun a job
    assert text == json.dumps(job, sort_keys=True)
    assert job["gpus"] == {**stage_gpus(config), **exp.cost.gpus} and job["seed"] == exp.seed
    # cost.gpus overrides a rule's shape
    exp = Experiment.parse({**config, "cost": {**config["cost"], "gpus": {"train": 7}}})
    assert job_params(exp).gpus["train"] == 7
