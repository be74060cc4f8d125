"""Real-recipe configs build their DAG offline and pass the training checks; the smoke recipes run
end to end."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from stillroom.config import Experiment, Train, load_yaml, resolve
from stillroom.io import read_jsonl
from stillroom.plan.dag import Plan
from stillroom.provenance.audit import audit

from ..conftest import (
    EARLY_NICE,
    REPO,
    Started,
    run_snakemake,
    started,
    structural_differences,
    wait_snakemake,
)
from ..readme import block, repo_copy, script, start, user_env
from .test_pipeline import scheduled


@pytest.mark.slow
def test_beam_distill_dag_builds_offline(dry_run):
    cfg = yaml.safe_load((REPO / "config" / "experiments" / "beam-distill.yaml").read_text())
    workdir, proc = dry_run([REPO / "config" / "experiments" / "beam-distill.yaml"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = scheduled(proc)
    # medium on all 62 shards; low/high/xhigh on 20, all three in one job (one file) per shard
    assert jobs["generate"] == 62 + 20
    assert "gen/beam-sglang/low+high+xhigh/shard-00019.jsonl" in proc.stdout
    assert jobs["grade_generation"] == 62 + 3 * 20
    assert jobs["benchmark"] == 6 and jobs["pretrained"] == 1 and "tokenizer" not in jobs
    # 5 models on 6 benchmarks, the 3 merges on the dev split the ratio is chosen on
    assert jobs["evaluate"] == 5 * 6 + 3 and jobs["tables"] == 6 and jobs["select_merge"] == 1
    assert jobs["train"] == 2  # the seed's two phases
    # sft and merge-0.5 at 4 efforts on 2 benchmarks; base, sft, merge-0.5 at 4 thinking budgets
    assert jobs["evaluate_effort"] == 2 * 2 * 4 and jobs["effort_tables"] == 2
    assert jobs["evaluate_budget"] == 3 * 2 * 4 and jobs["budget_tables"] == 2
    assert (
        "beam-sglang/xhigh/shard-00019" in proc.stdout
        and "beam-sglang/xhigh/shard-00020" not in proc.stdout
    )
    assert not (
        workdir / "results" / "beam-distill" / "pool"
    ).exists()  # nothing fetched at DAG build
    assert Train.parse(cfg["train"]).layout.world_size == 4  # the seed's 4 B200s, FSDP2


@pytest.mark.slow
def test_effort_shards_limit_an_effort_to_a_subset(tmp_path, small_cfg):
    small_cfg["generation"]["effort_shards"] = {"low": 1}
    jobs = scheduled(run_snakemake(tmp_path, small_cfg, "-n"))
    assert jobs["generate"] == 2 + 1


@pytest.mark.slow
def test_an_effort_group_is_generated_by_one_job(tmp_path, small_cfg):
    small_cfg["generation"]["effort_groups"] = [["low", "medium"]]
    graded = "results/small/graded/procedural/{}/shard-00000.jsonl"
    proc = run_snakemake(tmp_path, small_cfg, graded.format("low"), graded.format("medium"))
    out = proc.stdout + proc.stderr
    # one generate job writes both efforts' samples into one file; each is graded from it
    assert re.search(r"^generate\s+1$", out, re.M) and re.search(
        r"^grade_generation\s+2$", out, re.M
    )
    rows = read_jsonl(tmp_path / "results/small/gen/procedural/low+medium/shard-00000.jsonl")
    low = [r for r in rows if r["effort"] == "low"]
    medium = [r for r in rows if r["effort"] == "medium"]
    assert low and medium and len(low) + len(medium) == len(rows)
    assert [r["prompt_id"] for r in low] == [r["prompt_id"] for r in medium]
    for effort, recs in (("low", low), ("medium", medium)):
        assert [r["key"] for r in read_jsonl(tmp_path / graded.format(effort))] == [
            r["key"] for r in recs
        ]
    # the audit follows a graded effort back to the group's file, and finds it whole
    report = audit(graded.format("low"), root=tmp_path)
    assert report.ok, report.problems
    assert [n.path for n in report.nodes() if n.stage == "generate"] == [
        "results/small/gen/procedural/low+medium/shard-00000.jsonl"
    ]


@pytest.mark.slow
def test_beam_tiny_smoke_runs_end_to_end(tmp_path):
    """Seed 000's smoke: tiny MoE, LoRA on attention + experts, merge, evaluation, table."""
    import torch
    from safetensors.torch import load_file

    cfg = yaml.safe_load((REPO / "config" / "experiments" / "beam-tiny-smoke.yaml").read_text())
    run_snakemake(tmp_path, cfg)
    r = tmp_path / "results" / "beam-tiny-smoke"
    assert "| merge-0.5 |" in (r / "tables" / "heldout.md").read_text()
    assert (r / "ckpt" / "sft" / "adapter" / "adapter_config.json").exists()
    base, sft = (
        load_file(r / "ckpt" / "base" / "model.safetensors"),
        load_file(r / "ckpt" / "sft" / "model.safetensors"),
    )
    routers = [k for k in base if k.endswith("mlp.gate.weight")]
    assert routers and all(torch.equal(base[k], sft[k]) for k in routers)
    # the GPU job trained the adapter; a CPU job of its own merged it
    prov = json.loads((r / "ckpt" / "sft.adapter.prov.json").read_text())
    assert prov["rule"] == "train" and (
        prov["metrics"]["trainable"]["experts"] > 0 and prov["metrics"]["trainable"]["other"] == 0
    )
    merged = json.loads((r / "ckpt" / "sft.prov.json").read_text())
    assert merged["rule"] == "merge_adapter" and merged["metrics"]["tensors_merged"] > 0
    assert set(merged["inputs"]) == {"base", "adapter"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "overlay, layout",
    [
        ("beam-lora-fsdp", (32, 32, 1)),
        ("beam-qlora-mp", (1, 1, 1)),
        ("beam-qlora-experts-mp", (1, 1, 1)),
        ("beam-full-fsdp", (128, 128, 1)),
        ("beam-qlora-fsdp-staged", (8, 8, 1)),
        ("beam-nf4-qlora-b200", (8, 8, 1)),
    ],
)
def test_seed_000_overlays_merge_onto_the_distill_recipe_and_pass_the_training_checks(
    dry_run, overlay, layout
):
    """Snakemake merges `--configfile a b` with update_config; the merged train section must pass
    every fail-fast check (the target names are resolved against the real model at run time)."""
    from snakemake.utils import update_config

    cfg = yaml.safe_load((REPO / "config" / "experiments" / "beam-distill.yaml").read_text())
    update_config(
        cfg, yaml.safe_load((REPO / "config" / "experiments" / f"{overlay}.yaml").read_text())
    )
    p = Train.parse(resolve(cfg, root=REPO)["train"])
    d = p.layout
    assert (d.world_size, d.fsdp_size, d.dp_replicate_size) == layout
    assert not p.lora or not any(
        "mlp.gate" in t for t in p.lora.target_modules + p.lora.target_parameters
    )
    exp = REPO / "config" / "experiments"
    _, proc = dry_run([exp / "beam-distill.yaml", exp / f"{overlay}.yaml"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = scheduled(proc)
    # one epoch over the whole dataset: the overlay's epochs, not the distillation's two phases
    assert jobs["train"] == 1 and jobs["pretrained"] == 1


def test_autotriton_8b_dag_builds_offline(dry_run):
    """Seed 002 at scale: KernelBench benchmarks fetched by jobs, an 8B student, GRPO after SFT,
    kernel tables."""
    cfg = yaml.safe_load((REPO / "config" / "experiments" / "autotriton-8b.yaml").read_text())
    _, proc = dry_run([REPO / "config" / "experiments" / "autotriton-8b.yaml"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = scheduled(proc)
    assert jobs["benchmark"] == 2 and jobs["pretrained"] == 1 and jobs["grpo"] == 1
    assert (
        jobs["evaluate"] == 3 * 2 and jobs["tables"] == 2 and jobs["kernel_tables"] == 2
    )  # base, sft, grpo
    from stillroom.stages.grpo import Params

    p = Params.parse(
        {
            **cfg["grpo"],
            "validator": {k: cfg["kernels"][k] for k in ("device", "trials", "timeout_s")},
        },
        where="grpo",
    )
    assert p.layout.world_size == 8 and p.validator.device == "cuda"


@pytest.mark.slow
def test_autotriton_tiny_runs_end_to_end(tmp_path):
    """Seed 002 in miniature, on the elementwise family, by the README's command verbatim in a
    copy of the repository (about 10 minutes): teacher answers graded by the validator, SFT on
    instruction + reasoning + code, GRPO with the dual reward, kernel tables for base, sft and grpo
    on the training problems and on held-out ones."""
    command = block("snakemake --cores 2 --configfile config/experiments/autotriton-tiny.yaml")[0]
    copy = repo_copy(tmp_path / "repo")
    proc = subprocess.run(
        script(["source .venv/bin/activate", command]),
        cwd=copy,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    cfg = yaml.safe_load((copy / command.split("--configfile ")[1].split()[0]).read_text())
    r = copy / "results" / "autotriton-tiny"
    graded = read_jsonl(next((r / "graded" / "procedural").glob("*/shard-*.jsonl")))
    assert all(g["kind"] == "kernel" and g["grader"]["name"] == "kernel-validator" for g in graded)
    assert any(g["grade"]["correct"] for g in graded)
    slipped = [g["grade"]["details"] for g in graded if not g["grade"]["correct"]]
    assert all(d["reward"] == 0.0 for d in slipped)
    rows = read_jsonl(r / "dataset" / "train.jsonl")
    assert rows and all("```python" in row["messages"][-1]["content"] for row in rows)
    # the tokenizer learnt the code: a reference kernel is a few dozen tokens
    tok = AutoTokenizer.from_pretrained(r / "ckpt" / "base")
    code = rows[0]["messages"][-1]["content"].split("</think>")[1]
    assert len(tok(code)["input_ids"]) < 80
    rewards = read_jsonl(r / "ckpt" / "grpo" / "rewards.jsonl")
    grpo_cfg = cfg["grpo"]
    assert (
        len(rewards)
        == grpo_cfg["max_steps"] * grpo_cfg["group_size"] * grpo_cfg["prompts_per_step"]
    )
    prov = json.loads((r / "ckpt" / "grpo.prov.json").read_text())
    logged = [s["step"] for s in prov["metrics"]["per_step"]]
    assert prov["metrics"]["steps"] == grpo_cfg["max_steps"]
    assert logged and logged == sorted(set(logged)) and logged[-1] <= grpo_cfg["max_steps"]
    pool = read_jsonl(r / "pool" / "decontaminated.jsonl")
    for bench, problems in (("heldout", cfg["heldout"]["size"]), ("train", len(pool))):
        table = (r / "tables" / f"{bench}-kernels.md").read_text()
        for row in ("| base |", "| sft |", "| grpo |", "| grpo vs base |", "| grpo vs sft |"):
            assert row in table
        assert f"{problems} kernel problems × {cfg['eval']['samples']} samples" in table
    from stillroom.provenance.audit import audit

    report = audit(
        r / "tables" / "heldout-kernels.md"
    )  # back through GRPO, SFT and grading to the problem generator
    assert report.ok, report.to_dict()
    assert any(n.path.endswith("grpo") for n in report.nodes())


def test_the_smoke_twin_differs_from_the_recipe_only_in_sizes_ids_paths_and_urls():
    from stillroom.config import load_yaml

    exp = REPO / "config" / "experiments"
    recipe, twin = load_yaml(exp / "beam-distill.yaml"), load_yaml(exp / "beam-distill-smoke.yaml")
    assert structural_differences(recipe, twin) == []
    # the comparison itself catches what a twin must not change
    changed = yaml.safe_load(yaml.safe_dump(twin, sort_keys=False))
    changed["eval"]["backend"]["backend"] = "hf"
    changed["train"]["phases"][0]["tags"] = "as_built"
    del changed["merge"]["select_by"]
    changed["generation"]["efforts"] = ["medium", "low"]
    assert structural_differences(recipe, changed) == [
        "generation.efforts: 4 entries against 2",
        "train.phases.0.tags: 'none' against 'as_built'",
        "merge: keys ['select_by'] differ",
        "eval.backend.backend: 'sglang' against 'hf'",
    ]


def start_twin(workdir: Path) -> Started:
    """beam-distill-smoke as the README runs it, verbatim: its stand-in models built, then the
    recipe, in a copy of the repository in ``workdir``."""
    copy = repo_copy(workdir)
    commands = block("stillroom stand-ins --configfile config/experiments/beam-distill-smoke.yaml")
    return start(["source .venv/bin/activate", *commands], copy, workdir, EARLY_NICE)


@pytest.mark.slow
@pytest.mark.early_run.with_args(start_twin)
def test_the_smoke_twin_runs_the_recipe_end_to_end():
    """beam-distill-smoke through every path the recipe takes: hub-shaped local datasets, a Qwen3
    student trained through TRL's template in two phases over 2 gloo ranks, the teacher and every
    evaluated checkpoint served by a real OpenAI-compatible server started once for its jobs,
    per-effort and budget-forced evaluation, the dev split choosing the merge by tokens, IFEval
    and lettered multiple choice."""
    workdir, run = started(start_twin)
    wait_snakemake(run)

    r = workdir / "results" / "beam-distill-smoke"
    # the teacher's traces came through the served model, at every effort, and were graded
    # low, high and xhigh share one job and one file (generation.effort_groups)
    gen = read_jsonl(r / "gen" / "beam-sglang" / "low+high+xhigh" / "shard-00000.jsonl")
    assert {g["effort"] for g in gen} == {"low", "high", "xhigh"}
    assert gen and all(g["model"].endswith("results/stand-ins/beam-tiny") for g in gen)
    assert all(g["response"].startswith("<think>") for g in gen)
    dataset = json.loads((r / "dataset" / "train.jsonl.prov.json").read_text())["metrics"]
    assert set(dataset["samples_correct"]) == {"medium", "low", "high", "xhigh"}
    # two training phases, the second from the first; TRL's Qwen3 training template; the
    # checkpoint stops where it was trained to end its turn
    for stage in ("sft-medium", "sft"):
        metrics = json.loads((r / "ckpt" / f"{stage}.prov.json").read_text())["metrics"]
        assert metrics["chat_template"] == "trl" and metrics["world_size"] == 2
    tok = AutoTokenizer.from_pretrained(r / "ckpt" / "sft")
    eos = json.loads((r / "ckpt" / "sft" / "generation_config.json").read_text())["eos_token_id"]
    assert tok.convert_tokens_to_ids("<|im_end|>") in eos
    # every table of the recipe
    tables = r / "tables"
    for name in ("aime24", "aime25", "math500", "gpqa", "ifeval", "humaneval"):
        assert "| sft |" in (tables / f"{name}.md").read_text()
    for name in ("aime24", "aime25"):
        assert (tables / f"{name}-efforts.md").exists() and (tables / f"{name}-budgets.md").exists()
    assert (r / "cost" / "ledger.md").exists()
    # serve once, use many: one server start per served model (the plan's services: the teacher's
    # one server and the four evaluated checkpoints), counted from the servers' own logs, where
    # every generation and evaluation job used to start its own (51 starts)
    twin = Experiment.parse(load_yaml(REPO / "config" / "experiments" / "beam-distill-smoke.yaml"))
    services = Plan(twin, twin.dump(), REPO).services()
    starts = [log.read_text().count("healthy after") for log in (r / "logs" / "serve").glob("*")]
    assert len(services) == 5 and sorted(starts) == [1] * len(services)
    # the clients used those servers, and say which
    sidecar = json.loads((r / "eval" / "sft" / "gpqa" / "samples.jsonl.prov.json").read_text())
    assert sidecar["metrics"]["server"]["name"] == "model:sft"
    # served evaluation: long answers continued in request-sized segments
    rows = read_jsonl(r / "eval" / "base" / "aime24" / "samples.jsonl")
    assert any(len(row.get("segments", [])) == 2 for row in rows)
    # every IFEval row is kept, the postscript one too: lm-eval implements all 25 instruction ids
    ifeval = json.loads((r / "benchmarks" / "ifeval.jsonl.prov.json").read_text())["metrics"]
    rows = (REPO / "config" / "smoke" / "ifeval.jsonl").read_text().splitlines()
    assert ifeval["items"] == len(rows) == 6
