"""The real workflow on a reduced config: every stage runs, outputs and provenance are checked, and
a dry run after config changes schedules only what is stale."""

import copy
import re

import pytest

from stillroom.io import read_json, read_jsonl
from stillroom.provenance.sidecars import digest, sidecar_path

from ..conftest import run_snakemake, small_config

pytestmark = pytest.mark.slow


def scheduled(proc) -> dict[str, int]:
    """Job counts from a dry run's 'Job stats' table."""
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def test_every_stage_produced_its_artifacts(done):
    workdir, cfg, _ = done
    r = workdir / "results" / "small"
    for rel in [
        "pool/pool.jsonl",
        "pool/heldout.jsonl",
        "pool/decontaminated.jsonl",
        "pool/decontam_report.json",
        "shards/shard-00000.jsonl",
        "gen/procedural/low/shard-00001.jsonl",
        "graded/procedural/medium/shard-00000.jsonl",
        "dataset/train.jsonl",
        "student/tokenizer",
        "ckpt/base",
        "ckpt/sft",
        "ckpt/merge-0.5",
        "eval/merge-0.5/heldout/graded.jsonl",
        "tables/heldout.md",
        "tables/heldout.csv",
        "tables/heldout.png",
        "pool/dev.jsonl",
        "eval/merge-0.5/dev/graded.jsonl",
        "merge/selected.json",
        "tables/heldout.tex",
        "tables/tinycode.md",
        "tables/tinyifeval.csv",
        "tables/heldout-budgets.png",
        "cost/ledger.md",
        "eval/sft/heldout/budget-16/graded.jsonl",
        "eval/sft/heldout/effort-low/graded.jsonl",
        "tables/heldout-efforts.md",
        "tables/heldout-efforts.csv",
    ]:
        assert (r / rel).exists(), rel
        assert sidecar_path(r / rel).exists(), f"no provenance for {rel}"
    assert (r / "tables" / "heldout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_decontamination_drops_the_scraped_benchmark_copies(done):
    workdir, _, _ = done
    r = workdir / "results" / "small" / "pool"
    report = read_json(r / "decontam_report.json")
    dropped = {d["prompt_id"] for d in report["dropped"]}
    scraped = {p["prompt_id"] for p in read_jsonl(r / "pool.jsonl") if p["source"] == "scraped"}
    assert scraped and scraped <= dropped
    assert all(
        d["matches"] and {"benchmark", "item", "ngram"} <= set(d["matches"][0])
        for d in report["dropped"]
    )
    clean = {p["prompt_id"] for p in read_jsonl(r / "decontaminated.jsonl")}
    assert not clean & dropped
    held = {p["prompt_id"] for p in read_jsonl(r / "heldout.jsonl")}
    dev = {p["prompt_id"] for p in read_jsonl(r / "dev.jsonl")}
    assert len(dev) == 12 and not held & clean and not dev & clean and not dev & held


def test_tables_compare_every_model_with_base_and_tuned(done):
    workdir, _, _ = done
    md = (workdir / "results" / "small" / "tables" / "heldout.md").read_text()
    for model in ("base", "sft"):
        assert f"| {model} |" in md
    assert "| merge-0.5 (chosen on dev) |" in md and "Merge ratio chosen on `dev`" in md
    rows = (workdir / "results" / "small" / "tables" / "heldout.csv").read_text().splitlines()
    assert rows[0] == (
        "benchmark,model,problems,samples,accuracy,mean_tokens,cap_hit_rate,reference,delta,ci_low,"
        "ci_high,p_value,p_holm,verdict,mcnemar_p,delta_tokens,tokens_ci_low,tokens_ci_high,"
        "token_ratio"
    )
    assert len(rows) == 1 + 3 * 2


def test_provenance_links_inputs_by_hash(done):
    workdir, _, _ = done
    r = workdir / "results" / "small"
    prov = read_json(sidecar_path(r / "tables" / "heldout.md"))
    assert prov["stage"] == "tables" and prov["rule"] == "tables" and prov["config_sha256"]
    for item in prov["inputs"]["graded"]:
        assert digest(workdir / item["path"])["sha256"] == item["sha256"]
        assert item["provenance"] and (workdir / item["provenance"]).exists()
    model = read_json(sidecar_path(r / "ckpt" / "sft"))
    assert (
        "config.json" in model["files"]
        and model["metrics"]["final_loss"] < model["metrics"]["first_loss"]
    )
    assert set(model["packages"]) >= {"torch", "transformers", "trl"}
    assert model["params"]["seed"] == 1234


def test_nothing_is_stale_after_a_complete_run(done):
    workdir, cfg, _ = done
    assert scheduled(run_snakemake(workdir, cfg, "-n")) == {}


def reasons(proc) -> dict[str, list[str]]:
    """The reason Snakemake gives for each job of a dry run, by rule."""
    out: dict[str, list[str]] = {}
    pattern = r"^(?:local)?rule (\w+):\n(?:[ \t]+.*\n)*?[ \t]+reason: (.*)$"
    for m in re.finditer(pattern, proc.stdout, re.M):
        out.setdefault(m[1], []).append(m[2])
    return out


def test_a_deleted_table_file_or_sidecar_is_written_again(done):
    """Every file the table rules and the ledger write is a target of rule all, sidecars too: one
    deleted reruns its job (the CSV: for real), and nothing else."""
    workdir, cfg, _ = done
    tables = workdir / "results" / "small" / "tables"
    csv = tables / "heldout.csv"
    csv.unlink()
    plan = run_snakemake(workdir, cfg, "-n")
    assert scheduled(plan) == {"tables": 1, "all": 1}
    assert reasons(plan)["tables"] == ["Missing output files: results/small/tables/heldout.csv"]
    run_snakemake(workdir, cfg)
    assert csv.read_text().startswith("benchmark,model,") and sidecar_path(csv).exists()
    for rel, rule in [
        ("tables/heldout.png.prov.json", "tables"),
        ("tables/heldout-budgets.csv.prov.json", "budget_tables"),
        ("cost/ledger.md.prov.json", "cost"),
        ("pool/decontam_report.json", "decontam"),
    ]:
        path = workdir / "results" / "small" / rel
        saved = path.with_name(path.name + ".saved")
        path.rename(saved)
        try:
            plan = run_snakemake(workdir, cfg, "-n")
        finally:
            saved.rename(path)
        assert any(
            f"Missing output files: results/small/{rel}" in why for why in reasons(plan)[rule]
        ), (rel, reasons(plan))
    assert scheduled(run_snakemake(workdir, cfg, "-n")) == {}


def test_a_deleted_sidecar_of_an_intermediate_artifact_reruns_the_job_that_wrote_it(done):
    """Each rule declares its inputs' sidecars as inputs (the job hashes them into its own), so a
    missing one is a missing output of the job that writes it, as a missing artifact is."""
    workdir, cfg, _ = done
    r = workdir / "results" / "small"
    for rel, rule in [
        ("graded/procedural/low/shard-00000.jsonl.prov.json", "grade_generation"),
        ("ckpt/base.prov.json", "base"),
        ("eval/sft/heldout/graded.jsonl.prov.json", "grade_eval"),
        ("pool/dev.jsonl.prov.json", "pool"),
    ]:
        path = r / rel
        saved = path.with_name(path.name + ".saved")
        path.rename(saved)
        try:
            plan = run_snakemake(workdir, cfg, "-n")
        finally:
            saved.rename(path)  # as it was, mtime too: the run stays complete
        jobs = scheduled(plan)
        assert jobs[rule] == 1, (rel, jobs)
        assert any(
            f"Missing output files: results/small/{rel}" in why for why in reasons(plan)[rule]
        ), (rel, reasons(plan))
        assert "tables" in jobs, (rel, jobs)  # and what reads it downstream
    assert scheduled(run_snakemake(workdir, cfg, "-n")) == {}


def test_every_sidecar_the_run_wrote_is_a_target_of_rule_all(done):
    """Snakemake looks for a missing output only where something asks for it and is about to run,
    so rule all asks for every sidecar of the DAG (Plan.all_sidecars, stillroom/plan/dag.py): none
    missed."""
    workdir, cfg, proc = done
    log = proc.stdout + proc.stderr
    written = {p for line in re.findall(r"^\s+output: (.*)$", log, re.M) for p in line.split(", ")}
    plan = run_snakemake(workdir, cfg, "-n", "--forcerun", "all")
    targets = re.search(r"^(?:local)?rule all:\n\s+input: (.*)$", plan.stdout, re.M)[1]
    sidecars = {p for p in written if p.endswith(".prov.json")}
    assert len(sidecars) > 50 and sidecars <= set(targets.split(", ")), sidecars - set(targets)
    assert scheduled(plan) == {"all": 1}


def test_changing_merge_ratios_reruns_only_those_merges(done):
    workdir, cfg, _ = done
    cfg = copy.deepcopy(cfg)
    cfg["merge"]["ratios"] = [0.5, 0.25]
    jobs = scheduled(run_snakemake(workdir, cfg, "-n"))
    # the new merge is evaluated on the three reported benchmarks and on dev, where the ratio is
    # chosen again
    assert jobs == {
        "merge": 1,
        "evaluate": 4,
        "grade_eval": 4,
        "select_merge": 1,
        "tables": 3,
        "cost": 1,
        "all": 1,
    }


def test_changing_efforts_keeps_pool_and_tokenizer(done):
    workdir, cfg, _ = done
    cfg = copy.deepcopy(cfg)
    cfg["generation"]["efforts"] = ["low", "medium", "high"]
    jobs = scheduled(run_snakemake(workdir, cfg, "-n"))
    for rule in ("pool", "decontam", "shard", "tokenizer", "base"):
        assert rule not in jobs, jobs
    assert jobs["generate"] == 2 and jobs["grade_generation"] == 2  # only the new effort's shards
    # sft and the merge on the three reported benchmarks, the merge on dev (where its ratio is
    # chosen), and
    # sft's thinking-budget sweep; base is unchanged
    assert jobs["train"] == 1 and jobs["evaluate"] == 7 and jobs["evaluate_budget"] == 2


def test_adding_a_selection_to_the_ablation_never_rebuilds_the_fine_tune(done):
    workdir, cfg, _ = done
    cfg = copy.deepcopy(cfg)
    cfg["dataset"]["ablation"] = ["unfiltered"]
    jobs = scheduled(run_snakemake(workdir, cfg, "-n"))
    assert "dataset" not in jobs and "train" not in jobs, jobs
    assert jobs["dataset_ablation"] == 1 and jobs["train_ablation"] == 1 and jobs["tables"] == 3
    target = workdir / "results" / "small" / "dataset" / "select-unfiltered.jsonl"
    run_snakemake(workdir, cfg, str(target.relative_to(workdir)))
    metrics = read_json(sidecar_path(target))["metrics"]
    shortest = read_jsonl(workdir / "results" / "small" / "dataset" / "train.jsonl")
    assert metrics["select"] == "unfiltered" and metrics["examples"] == len(read_jsonl(target))
    assert metrics["examples_correct"] < metrics["examples"] and len(shortest) < metrics["examples"]


def test_a_later_training_phase_never_reruns_an_earlier_one(done):
    """Training in phases: each phase its own job and artifact, from the previous checkpoint."""
    workdir, cfg, _ = done
    cfg = copy.deepcopy(cfg)
    cfg["train"].pop("epochs", None)  # the phases give their own
    cfg["train"]["phases"] = [
        {"name": "medium", "efforts": ["medium"], "tags": "none", "epochs": 1},
        {"name": "mixed", "epochs": 1},
    ]
    first = workdir / "results" / "small" / "ckpt" / "sft-medium"
    run_snakemake(workdir, cfg, str(first.relative_to(workdir)))
    prov = read_json(sidecar_path(first))
    assert prov["params"]["phase"]["name"] == "medium" and prov["metrics"]["examples"] > 0
    cfg["train"]["phases"][1]["epochs"] = 2
    plan = run_snakemake(workdir, cfg, "-n", "-p")
    jobs = scheduled(plan)
    assert jobs["train"] == 1 and "dataset" not in jobs  # the second phase only
    assert "--base results/small/ckpt/sft-medium " in plan.stdout
    assert "--out-model results/small/ckpt/sft-medium " not in plan.stdout


def test_provenance_walks_from_the_table_to_the_teacher_records(done):
    """The sidecar links are enough for an audit: every input re-hashes to what its consumer
    recorded, and following them from the table reaches the raw generation shards and the
    sources."""
    workdir, _, _ = done
    todo = [sidecar_path(workdir / "results" / "small" / "tables" / "heldout.md")]
    seen, stages = set(), set()
    while todo:
        side = todo.pop()
        if side in seen:
            continue
        seen.add(side)
        prov = read_json(side)
        stages.add(prov["stage"])
        assert digest(workdir / prov["artifact"])["sha256"] == prov["sha256"], prov["artifact"]
        for entry in prov["inputs"].values():
            for item in entry if isinstance(entry, list) else [entry]:
                assert digest(workdir / item["path"])["sha256"] == item["sha256"], item["path"]
                if item["provenance"]:
                    todo.append(workdir / item["provenance"])
    assert {
        "tables",
        "grade",
        "evaluate",
        "merge",
        "train",
        "dataset",
        "generate",
        "shard",
        "decontam",
        "pool",
        "base",
        "tokenizer",
    } <= stages
    example = read_jsonl(workdir / "results" / "small" / "dataset" / "train.jsonl")[0]
    graded = {r["key"]: r for r in read_jsonl(workdir / example["source_record"]["file"])}
    assert graded[example["id"]]["response"] == example["messages"][-1]["content"]


def test_html_report_registers_every_table_and_plot(done):
    workdir, cfg, _ = done
    run_snakemake(workdir, cfg, "--report", "report.html")
    html = (workdir / "report.html").read_text()
    for name in ("heldout.csv", "heldout.png", "tinycode.csv", "heldout-budgets.png", "ledger.csv"):
        assert name in html
    assert "Holm" in html and "Cost ledger" in html  # captions rendered


def test_snakemake_rejects_bad_config_before_any_job(tmp_path, small_cfg):
    small_cfg["train"]["lr"] = -1
    small_cfg["eval"]["temprature"] = 0.5
    proc = run_snakemake(tmp_path, small_cfg, "-n", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "train.lr" in out and "eval: unknown key 'temprature'" in out
    assert not (tmp_path / "results" / "small" / "pool").exists()


PHASES = [
    {"name": "medium", "efforts": ["medium"], "tags": "none", "epochs": 1},
    {"name": "mixed", "epochs": 1},
]


@pytest.mark.parametrize(
    "change, merges",
    [
        # each phase from the previous one's merged checkpoint
        ({"train": {"phases": PHASES}}, (("base", "sft-medium"), ("sft-medium", "sft"))),
        (
            {"dataset": {"ablation": ["unfiltered"]}},
            (("base", "sft"), ("base", "select-unfiltered")),
        ),
    ],
)
def test_each_lora_training_job_has_its_adapter_merged_by_a_cpu_job(tmp_path, change, merges):
    """LoRA: every training job (each phase, each ablation selection) writes its adapter, and a
    merge_adapter job of its own writes the checkpoint the next phase and the evaluations read."""
    cfg = small_config()
    cfg["train"].update(method="lora", lora={"r": 4, "alpha": 8, "target_modules": ["q_proj"]})
    if "phases" in change.get("train", {}):
        cfg["train"].pop("epochs", None)  # the phases give their own
    for section, values in change.items():
        cfg[section].update(values)
    plan = run_snakemake(tmp_path, cfg, "-n", "-p")
    jobs = scheduled(plan)
    trained = jobs["train"] + jobs.get("train_ablation", 0)
    assert trained == jobs["merge_adapter"] == len(merges)
    ckpt = "results/small/ckpt"
    for base, name in merges:
        assert f"--base {ckpt}/{base} --dataset" in plan.stdout  # trained from the merged one
        assert f"--out-model {ckpt}/{name}.adapter " in plan.stdout
        assert (
            f"--base {ckpt}/{base} --adapter {ckpt}/{name}.adapter --out-model {ckpt}/{name} "
            in plan.stdout
        )
