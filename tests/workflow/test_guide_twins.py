"""The MoE guide's fine-tuning recipes (overlays on beam-distill.yaml) each have a CPU smoke twin
(an overlay on beam-tiny-smoke.yaml) with the same train keys, only sizes changed, that trains and
merges the tiny MoE through the recipe's code path."""

import json
import math
import re

import pytest
import torch
from safetensors.torch import load_file

from stillroom.config import Train, load_yaml, merge_configs, resolve

from ..conftest import REPO, run_snakemake, structural_differences

EXP = REPO / "config" / "experiments"

# (recipe, twin): the recipe runs over beam-distill.yaml, its twin over beam-tiny-smoke.yaml.
TWINS = [
    ("beam-qlora-mp", "beam-qlora-mp-smoke"),
    ("beam-qlora-experts-mp", "beam-qlora-experts-mp-smoke"),
    ("beam-lora-fsdp", "beam-lora-fsdp-smoke"),
    ("beam-qlora-fsdp-staged", "beam-qlora-fsdp-staged-smoke"),
    ("beam-nf4-qlora-b200", "beam-nf4-qlora-b200-smoke"),
]
IDS = [twin for _, twin in TWINS]


def recipe_config(recipe: str) -> dict:
    return merge_configs(load_yaml(EXP / "beam-distill.yaml"), load_yaml(EXP / f"{recipe}.yaml"))


def twin_config(twin: str) -> dict:
    return merge_configs(load_yaml(EXP / "beam-tiny-smoke.yaml"), load_yaml(EXP / f"{twin}.yaml"))


@pytest.mark.parametrize("recipe, twin", TWINS, ids=IDS)
def test_the_twin_trains_as_its_recipe_does_at_smoke_size(recipe, twin):
    overlay = load_yaml(EXP / f"{twin}.yaml")
    assert overlay["experiment"] == twin and set(overlay) == {"experiment", "train"}
    header = (EXP / f"{twin}.yaml").read_text().split("\nexperiment:")[0]
    assert f"twin of {recipe}.yaml" in header
    assert re.search(rf"--configfile \S*beam-tiny-smoke\.yaml \S*{twin}\.yaml", header)
    # every train key the recipe sets is set by the twin, none left to beam-tiny-smoke's values
    recipe_train = load_yaml(EXP / f"{recipe}.yaml")["train"]
    assert set(recipe_train) <= set(overlay["train"])
    assert set(recipe_train.get("lora", {})) <= set(overlay["train"].get("lora", {}))
    # the train sections that run, every default filled in, differ in sizes only
    ran = resolve(recipe_config(recipe), root=REPO)["train"]
    smoke = resolve(twin_config(twin), root=REPO)["train"]
    assert structural_differences(ran, smoke, "train") == []
    # one device_map process stays one; a sharded layout stays sharded over several processes
    a, b = Train.parse(ran), Train.parse(smoke)
    assert (a.sharded, a.layout.world_size > 1) == (b.sharded, b.layout.world_size > 1)


def weights(model_dir) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.fixture(scope="module")
def twins_workdir(tmp_path_factory):
    """One working directory for every twin, run under one experiment name: the twins differ from
    beam-tiny-smoke only in train (test_the_twin_trains_as_its_recipe_does_at_smoke_size), so the
    pool, generation, dataset and base model are built once and each twin reruns only its training
    and its adapter's merge (Snakemake's params trigger)."""
    return tmp_path_factory.mktemp("guide-twins")


SHARED = "guide-twins"


@pytest.mark.slow
@pytest.mark.parametrize("recipe, twin", TWINS, ids=IDS)
def test_the_twin_trains_and_merges_the_tiny_moe(twins_workdir, recipe, twin):
    """The twin's workflow up to the merged fine-tune (no evaluation): the adapter trained by rule
    train in the recipe's layout, merged by its own CPU job, the router untouched."""
    cfg = {**twin_config(twin), "experiment": SHARED}
    p = Train.parse(resolve(cfg, root=REPO)["train"])
    proc = run_snakemake(twins_workdir, cfg, f"results/{SHARED}/ckpt/sft")
    r = twins_workdir / "results" / SHARED
    log = proc.stdout + proc.stderr
    assert re.search(r"^(?:local)?rule train:", log, re.M), "this twin's training did not run"
    assert not (r / "eval").exists() and not (r / "tables").exists()

    trained = json.loads((r / "ckpt" / "sft.adapter.prov.json").read_text())
    assert trained["rule"] == "train"
    merged = json.loads((r / "ckpt" / "sft.prov.json").read_text())
    assert merged["rule"] == "merge_adapter" and merged["metrics"]["tensors_merged"] > 0
    assert set(merged["inputs"]) == {"base", "adapter"}

    m = trained["metrics"]
    assert m["world_size"] == p.layout.world_size
    layers = cfg["student"]["model"]["num_hidden_layers"]
    # bitsandbytes quantises every attention projection and leaves the fused experts in bf16;
    # the staged NF4 loader quantises each expert's two projections too (each rank its share
    # under expert parallelism; the metrics are rank 0's)
    held = cfg["student"]["model"]["num_experts"] // p.layout.expert_parallel_size
    experts_nf4 = 2 * held * layers
    quantized = {
        "attention": 4 * layers if p.load_in_4bit else 0,
        "experts": experts_nf4 if p.quantize_moe_experts else 0,
        "other": 0,
    }
    assert m["four_bit_weights"] == quantized
    experts = any("experts" in t for t in p.lora.target_parameters)
    assert m["trainable"]["attention"] > 0 and m["trainable"]["other"] == 0
    assert (m["trainable"]["experts"] > 0) == experts
    assert all(math.isfinite(x) for x in m["losses"]) and m["final_loss"] < m["first_loss"]

    base, sft = weights(r / "ckpt" / "base"), weights(r / "ckpt" / "sft")
    assert set(base) == set(sft)
    routers = [k for k in base if k.endswith("mlp.gate.weight")]
    assert len(routers) == layers and all(torch.equal(base[k], sft[k]) for k in routers)
    changed = {k for k in base if not torch.equal(base[k], sft[k])}
    assert any("self_attn.q_proj" in k for k in changed)
    assert any(".experts." in k for k in changed) == experts
