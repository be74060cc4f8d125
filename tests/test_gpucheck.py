"""The one-shot GPU check: every check run on CPU at toy sizes (sdpa and float32, NF4 on CPU,
Triton's interpreter), each check isolated and time-limited, and a skipped summary without a GPU.
On a machine with a GPU the checks also run on it here, at reduced sizes; ``make gpu-check`` runs
them at full size."""

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from stillroom.gpucheck import harness
from stillroom.gpucheck.common import SIZES
from stillroom.gpucheck.fixture import build_fixture, check_kwargs
from stillroom.gpucheck.kernels import check_kernels

from .conftest import REPO

CPU = SIZES["cpu"]
# the GPU model (a leak must show through bf16 noise), fewer steps, two kernels
GPU = dataclasses.replace(
    SIZES["cuda"], conversations=256, steps=4, moe_steps=4, kernel_problems=("relu", "add")
)


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return build_fixture(tmp_path_factory.mktemp("gpucheck"), CPU)


@pytest.fixture(scope="module")
def gpu_fixture(tmp_path_factory):
    return build_fixture(tmp_path_factory.mktemp("gpucheck-gpu"), GPU)


@pytest.fixture
def cpu_only(monkeypatch):
    """The trainer, the NF4 loader and the hf backend take a GPU whenever they see one: hidden, so
    that the CPU checks run on CPU on a GPU machine too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def target(name):
    """Check ``name``'s function, as its isolated process finds it."""
    module, _, function = harness.CHECKS[name].partition(":")
    return getattr(importlib.import_module(module), function)


def run(name, fixture, device="cpu", sizes=CPU):
    return target(name)(**check_kwargs(name, device, sizes, fixture), log=lambda _: None)


def test_every_check_names_a_function_of_its_own_module():
    for name in harness.CHECKS:
        assert target(name).__name__ == f"check_{name}"
        assert target(name).__module__.startswith("stillroom.gpucheck.")


@pytest.mark.slow
def test_without_a_gpu_the_summary_says_skipped_and_exits_0(tmp_path):
    out = tmp_path / "gpu-check.json"
    proc = subprocess.run(
        [sys.executable, "-m", "stillroom.gpucheck", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert json.loads(proc.stdout) == summary
    assert summary["status"] == "skipped" and summary["reason"].startswith("no CUDA device")
    assert summary["checks"] == {
        name: {"status": "skipped", "reason": "no CUDA device"} for name in harness.CHECKS
    }
    assert summary["versions"]["torch"]


@pytest.mark.slow
def test_packed_and_padded_rows_train_alike(fixture, cpu_only):
    r = run("sft", fixture)
    assert r["status"] == "pass", r["failures"]
    assert r["attn_implementation"] == "sdpa" and r["precision"] == "float32"
    assert r["packed"]["documents_per_row"] > 1  # the comparison packs something
    assert len(r["packed"]["losses"]) == len(r["padded"]["losses"]) == CPU.steps
    assert r["step0_loss_abs_diff"] <= 1e-4 < r["step0_leaky_abs_diff"]
    assert r["packed"]["loss_decreased"] and r["padded"]["loss_decreased"]
    assert r["packed"]["tokens_per_s"] > 0 and r["padded"]["padding_share"] > 0
    assert r["trainer"]["loss_decreased"] and r["trainer"]["on"] == "cpu"


def test_qlora_trains_its_adapters_on_an_nf4_base(fixture, cpu_only):
    # bitsandbytes runs NF4 on CPU too (load_model keeps LoRA gradients alive there)
    r = run("qlora", fixture)
    assert r["status"] == "pass", r["failures"]
    assert r["nf4_layers"] == 7 * CPU.model["num_hidden_layers"] and r["nf4_on"] == ["cpu"]
    assert r["memory_mib"]["nf4_weights"] < r["memory_mib"]["same_weights_in_bf16"]
    first, last = r["grads_per_step"][0], r["grads_per_step"][-1]
    # LoRA B starts at zero, so A gets no gradient at step 0; every tensor does after
    assert first["none"] == 0 and first["zero"] == first["total"] / 2
    assert last["zero"] == 0 and r["trainable"]["other"] > 0


@pytest.mark.slow
def test_flagship_trains_nf4_experts_on_two_fsdp2_ranks_and_merges_by_streaming(fixture, cpu_only):
    # the train stage's torchrun workers on 2 gloo ranks (the GPUs hidden from them too), then
    # the merge in a process of its own
    r = run("qlora_fsdp_staged", fixture)
    assert r["status"] == "pass", r["failures"]
    assert (r["processes"], r["fsdp2"], r["dtype"]) == (2, True, "float32")
    assert len(r["losses"]) == CPU.moe_steps and r["losses"][-1] < r["losses"][0]
    assert r["tokens_per_s"] > 0 and r["train_s"] > 0
    shape = CPU.moe_model
    layers, experts = shape["num_hidden_layers"], shape["num_experts"]
    # q, k, v, o per layer; gate_up and down per expert and layer
    assert r["four_bit_weights"] == {
        "attention": 4 * layers,
        "experts": 2 * experts * layers,
        "other": 0,
    }
    assert r["trainable"]["experts"] > 0 and r["trainable"]["attention"] > 0
    # A and B for each of 4 attention projections and 2 fused expert parameters per layer
    assert r["adapter_tensors"] == 2 * 6 * layers
    assert r["peak_gpu_memory_mib"] is None and len(r["peak_host_rss_mib"]) == 2
    merge = r["merge"]
    assert merge["status"] == "pass" and merge["adapted_parameters"] == 6 * layers
    # the checkpoint stores one tensor per expert: gate, up and down of each
    assert r["expert_tensors_changed"] == 3 * experts * layers
    assert merge["tensors_changed"] == 4 * layers + r["expert_tensors_changed"]
    assert merge["peak_rss_mib"] >= merge["rss_before_mib"] > 0 and merge["seconds"] > 0
    assert r["routers"] == layers and r["routers_unchanged"]
    assert r["logits_max_abs_diff"] <= r["logits_tolerance"] < r["adapter_logits_effect"]


def test_evaluate_writes_every_sample(fixture, cpu_only):
    r = run("evaluate", fixture)
    assert r["status"] == "pass", r["failures"]
    assert r["samples_written"] == CPU.eval_problems * CPU.eval_samples
    assert r["completion_tokens"] > 0 and r["gpu_memory_mib"] is None


def test_kernel_solutions_score_through_the_reward():
    r = check_kernels(
        **{
            **check_kwargs("kernels", "cpu", CPU, {}),
            "problems": ["relu", "add"],
            "corpus": ["tutorial_01_vector_add", "tutorial_06_fused_attention_block_ptr"],
        },
        log=lambda _: None,
    )
    assert r["status"] == "pass", r["failures"]
    assert (r["problems"], r["passed"], r["not_run"]) == (2, 2, 0)
    # the honest corpus replayed after them, each held to what it earns on CPU (1, or a refusal
    # a GPU compile gives too)
    corpus = r["corpus"]
    assert (corpus["run"], corpus["as_expected"], corpus["not_run"]) == (2, 2, 0), corpus
    assert corpus["entries"]["tutorial_01_vector_add"]["reward"] == 1
    # only a GPU times kernels
    assert r["speedup_geomean"] is None and r["per_problem"]["relu"]["reward"] == 1.0


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device (make gpu-check runs these checks at full size)",
)
@pytest.mark.parametrize("name", list(harness.CHECKS))
def test_the_checks_pass_on_a_gpu(name, gpu_fixture):
    r = run(name, gpu_fixture, "cuda", GPU)
    assert r["status"] == "pass", r["failures"]


def test_each_check_is_isolated_time_limited_and_within_the_deadline():
    here = "tests.gpucheck_targets"
    plan = {
        "boom": (f"{here}:failing", {}, 30),
        "hang": (f"{here}:hanging", {}, 4),
        "fine": (f"{here}:passing", {}, 30),
    }
    lines = []
    env = {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    deadline = time.monotonic() + 300
    results = harness.run_checks(plan, deadline=deadline, env=env, log=lines.append)
    assert results["boom"]["status"] == "error"
    assert "RuntimeError: the GPU is on fire" in results["boom"]["error"]
    assert results["hang"]["status"] == "timeout" and results["hang"]["wall_s"] < 10
    assert "about to hang" in results["hang"]["log_tail"] and "[hang] about to hang" in lines
    fine = results["fine"]
    assert (fine["status"], fine["limit_s"], fine["value"]) == ("pass", 30, 1)
    # no check starts with too little time left to finish
    late = harness.run_checks(
        {"late": plan["fine"]}, deadline=time.monotonic() + harness.MIN_START_S - 1, env=env
    )
    assert late["late"]["status"] == "skipped" and "deadline" in late["late"]["reason"]
