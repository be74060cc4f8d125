"""profiles/slurm without a cluster: the sbatch submissions the real recipes would make, rendered by
the executor plugin's own submit-string code from a Snakemake dry run (stillroom/plan/slurm.py), and
the job shapes the rules derive from config (stillroom/plan/cluster.py,
tests/plan/test_cluster.py)."""

import re

import pytest
import yaml

from stillroom.plan.slurm import plan

from ..conftest import REPO, run_snakemake, small_config

EXP = REPO / "config" / "experiments"
DISTILL = EXP / "beam-distill.yaml"


def opts(line: str) -> dict[str, str]:
    """sbatch options as {flag: value}: `-p gpu`, `--gpus=2`, `--requeue` -> {'-p': 'gpu', ...}."""
    found = re.findall(r"(--?[\w-]+)(?:[ =]((?!-)\S+))?", line.removeprefix("sbatch"))
    return {flag: value for flag, value in found}


@pytest.fixture(scope="module")
def distill():
    return plan([DISTILL])


def test_distillation_recipe_submissions(distill):
    counts = {rule: p.jobs for rule, p in distill.items()}
    # serve once, use many: the teacher's 8 servers (generation.servers), each one allocation
    # holding the server and its shards' jobs (62 medium, 20 low+high+xhigh); each checkpoint's
    # server likewise holds its evaluations (5 models x 6 benchmarks and the 3 merges on dev)
    teacher = {k: p for k, p in distill.items() if k.startswith("serve_teacher")}
    models = {k: p for k, p in distill.items() if k.startswith("serve_model")}
    assert sum(p.jobs for p in teacher.values()) == 8
    assert sum(p.clients["generate"] for p in teacher.values()) == 62 + 20
    assert sum(p.jobs for p in models.values()) == 5
    assert sum(p.clients.get("evaluate", 0) for p in models.values()) == 5 * 6 + 3
    assert not any(k.startswith(("generate", "evaluate")) for k in distill)  # all are clients
    assert (
        counts["grade_generation"] == 62 + 3 * 20
        and counts["train[phase=medium]"]
        == counts["train[phase=efforts]"]
        == 1  # the seed's phases
    )
    for p in teacher.values():
        # the SGLang teacher: server.tp 2 on one node, one task; its clients ask no CPU or GPU
        gen = opts(p.sbatch)
        assert (gen["-p"], gen["--gpus"], gen["--nodes"], gen["--cpus-per-task"]) == (
            "gpu",
            "2",
            "1",
            "16",
        )
        per_allocation = p.clients["generate"] // p.jobs
        assert (gen["-t"], gen["--mem"]) == ("2880", str(256000 + 4000 * per_allocation))
        # one sbatch per allocation, no arrays: a requeued array task failed its siblings
        assert "--ntasks-per-gpu" not in gen and "--requeue" in gen and "--array" not in gen
    for p in models.values():  # an SGLang server of one GPU per checkpoint
        ev = opts(p.sbatch)
        assert (ev["-p"], ev["--gpus"], ev["-t"], ev["--cpus-per-task"]) == (
            "gpu",
            "1",
            "2880",
            "16",
        )

    # the seed's second phase ran on a whole node: its job has its own shape
    assert opts(distill["train[phase=efforts]"].sbatch)["--gpus"] == "8"
    train = opts(distill["train[phase=medium]"].sbatch)  # FSDP2 over the seed's 4 GPUs of one node
    assert (train["-p"], train["--gpus"], train["--nodes"], train["-t"], train["--mem"]) == (
        "gpu",
        "4",
        "1",
        "2880",
        "1000000",
    )
    assert "--gres" not in train and "--ntasks-per-gpu" not in train

    for rule in (
        "pool",
        "decontam",
        "grade_generation",
        "dataset",
        "merge",
        "tables",
        "cost",
        "pretrained",
    ):
        cpu = opts(distill[rule].sbatch)
        assert (
            cpu["-p"] == "cpu"
            and cpu["--ntasks"] == "1"
            and "--gpus" not in cpu
            and "--gres" not in cpu
        ), rule


@pytest.mark.parametrize(
    "overlay, nodes, per_node", [("beam-lora-fsdp", 4, 8), ("beam-full-fsdp", 16, 8)]
)
def test_multi_node_training_is_one_launcher_task_per_node_with_gpus_per_node(
    overlay, nodes, per_node
):
    train = opts(plan([DISTILL, EXP / f"{overlay}.yaml"])["train"].sbatch)
    assert (train["--nodes"], train["--ntasks"], train["--gres"]) == (
        str(nodes),
        str(nodes),
        f"gpu:{per_node}",
    )
    assert (
        train["--cpus-per-task"] == "64"
        and "--gpus" not in train
        and "--ntasks-per-gpu" not in train
    )


def test_an_adapter_is_merged_by_a_cpu_job_after_the_gpu_one(distill):
    """LoRA: the GPU job saves the adapter; the merge is a job of its own on the CPU partition, with
    memory for two shards and the adapter, not the model."""
    lora = plan([DISTILL, EXP / "beam-lora-fsdp.yaml"])
    merge = opts(lora["merge_adapter"].sbatch)
    assert lora["merge_adapter"].jobs == lora["train"].jobs == 1
    assert (merge["-p"], merge["--cpus-per-task"], merge["--mem"]) == ("cpu", "2", "32000")
    assert "--gpus" not in merge and "--gres" not in merge
    assert "merge_adapter" not in distill  # a full fine-tune has nothing to merge


def test_device_map_training_is_one_process_over_the_nodes_gpus():
    train = opts(plan([DISTILL, EXP / "beam-qlora-mp.yaml"])["train"].sbatch)
    assert (train["--nodes"], train["--gpus"]) == ("1", "8") and "--ntasks" not in train


def test_kernel_recipe_grades_and_trains_on_gpus():
    """autotriton-8b: GRPO FSDP2 over one 8-GPU node; compiled-kernel grading asks for a GPU, on the
    GPU partition."""
    kernels = plan([EXP / "autotriton-8b.yaml"])
    grpo = opts(kernels["grpo"].sbatch)
    assert (grpo["-p"], grpo["--gpus"], grpo["--nodes"], grpo["--cpus-per-task"]) == (
        "gpu",
        "8",
        "1",
        "16",
    )
    for rule in ("grade_generation", "grade_eval"):
        grade = opts(kernels[rule].sbatch)
        assert (grade["-p"], grade["--gpus"]) == ("gpu", "1"), rule
    assert kernels["kernel_tables"].jobs == 2 and "--gpus" not in opts(
        kernels["kernel_tables"].sbatch
    )


def test_an_api_teacher_generates_on_the_cpu_partition(tmp_path):
    overlay = tmp_path / "api.yaml"
    overlay.write_text(yaml.safe_dump({"generation": {"teacher": "beam-api"}}))
    gen = opts(plan([DISTILL, overlay])["generate[efforts=medium]"].sbatch)
    assert gen["-p"] == "cpu" and "--gpus" not in gen and gen["--cpus-per-task"] == "16"


def test_per_run_overrides_replace_the_profiles_entries():
    """Why the profile says to change resources in the file: Snakemake replaces the profile's
    set-resources (and set-threads) with the command line's instead of merging them."""
    plans = plan([DISTILL], extra=["--set-resources", "generate:mem_mb=7"])
    train = opts(plans["train[phase=medium]"].sbatch)
    assert train["-p"] == "cpu"  # default-resources' partition: the profile's train entry is gone
    assert train["--mem"] == "1000000"  # the rule's own, from the student's size
    assert opts(plans["grade_generation"].sbatch)["--mem"] == "8000"  # default-resources'


def test_memory_of_the_student_holding_jobs_follows_the_students_size(tmp_path, distill):
    """The small config's student asks the least (8 GB) where beam-distill's 4B one
    asks the sizes the profile had: 1 TB to train, 256 GB to merge, 128 GB to evaluate."""
    cfg = small_config()
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(cfg))
    small = plan([path])
    for rule in ("train", "merge", "evaluate", "evaluate_budget"):
        assert opts(small[rule].sbatch)["--mem"] == "8000", (rule, small[rule].sbatch)
    assert opts(distill["train[phase=medium]"].sbatch)["--mem"] == "1000000"
    assert opts(distill["train[phase=efforts]"].sbatch)["--mem"] == "1000000"
    assert opts(distill["merge"].sbatch)["--mem"] == "256000"
    for p in (p for k, p in distill.items() if k.startswith("serve_model")):
        # the checkpoint's server holds the student; each of its clients 4 GB
        per_allocation = sum(p.clients.values()) // p.jobs
        assert opts(p.sbatch)["--mem"] == str(128000 + 4000 * per_allocation), p
    third = opts(plan([path], extra=["--attempt", "3"])["evaluate"].sbatch)
    assert third["--mem"] == "24000"  # a retry asks more, as the profile's `* attempt` did


def test_retries_come_back_with_more_memory_and_time():
    first = opts(plan([DISTILL], extra=["--attempt", "1"])["grade_generation"].sbatch)
    third = opts(plan([DISTILL], extra=["--attempt", "3"])["grade_generation"].sbatch)
    assert (int(third["--mem"]), int(third["-t"])) == (
        3 * int(first["--mem"]),
        3 * int(first["-t"]),
    )


@pytest.mark.parametrize("profile", ["slurm", "default"])
def test_every_profile_entry_says_why(profile):
    """Each top-level key and each rule's entry carries a comment, inline or on the line above."""
    path = REPO / "profiles" / profile / "profile.yaml"
    lines = path.read_text().splitlines()
    assert yaml.safe_load(path.read_text())
    for i, line in enumerate(lines):
        if re.match(r"^( {2})?[\w-]+:", line):  # a key at the top or one level down
            commented = "#" in line or (i > 0 and lines[i - 1].lstrip().startswith("#"))
            assert commented, f"{path.name}:{i + 1}: {line.strip()!r} has no comment"


def test_unset_cluster_environment_stops_before_anything_is_submitted(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_ACCOUNT", raising=False)
    monkeypatch.delenv("STILLROOM_GPU_PARTITION", raising=False)
    monkeypatch.setenv("STILLROOM_CPU_PARTITION", "cpu")
    proc = run_snakemake(
        tmp_path, small_config(), "--profile", str(REPO / "profiles" / "slurm"), "-n", check=False
    )
    assert proc.returncode != 0
    assert (
        "need SLURM_ACCOUNT, STILLROOM_GPU_PARTITION in the environment"
        in proc.stderr + proc.stdout
    )
