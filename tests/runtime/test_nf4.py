"""QLoRA with the base in torchao NF4, fused experts included (stillroom/runtime/nf4.py), on the
tiny Qwen3-MoE: the quantised forward, the adapter in PEFT's format, FSDP2 on 2 gloo ranks against
one process, and the memory."""

import json
import shutil

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from torchao.quantization import NF4Tensor
from transformers import AutoModelForCausalLM

from stillroom.config import ConfigError, Train
from stillroom.runtime.launch import spawn
from stillroom.runtime.nf4 import (
    NF4Experts,
    NF4Linear,
    load_staged,
    nf4_lora,
    quantize_nf4,
    save_adapter,
    storage_bytes,
    to_nf4,
)
from stillroom.stages.train import run as train_stage
from tests.runtime.nf4_steps import qlora_steps, skewed_dispatch, staged_shards, token_blocks
from tests.runtime.test_launch import kill_and_resume

LORA = {
    "r": 4,
    "lora_alpha": 8,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    "task_type": "CAUSAL_LM",
}


def load(root, dtype=torch.float32):
    model = AutoModelForCausalLM.from_pretrained(root / "base", dtype=dtype)
    model.config.use_cache = False
    return model.eval()


@torch.no_grad()
def dequantized(root, quantized) -> torch.nn.Module:
    """The unquantised model with every weight ``quantized`` holds in NF4 replaced by its
    dequantised value: what the NF4 forward must compute."""
    plain = load(root)
    for name, module in quantized.named_modules():
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        if isinstance(module, NF4Linear):
            plain.get_submodule(name).weight.copy_(module.weight.get_original_weight())
        elif isinstance(module, NF4Experts):
            experts = plain.get_submodule(name)
            for param in ("gate_up_proj", "down_proj"):
                for e, w in enumerate(getattr(module, f"{param}_nf4")):
                    getattr(experts, param)[e].copy_(w.get_original_weight())
    return plain


def test_quantised_moe_computes_the_dequantised_weights_and_leaves_the_router(moe):
    root, _ = moe
    model = load(root)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert quantize_nf4(model) == {"linear": 8, "experts": 2}  # q, k, v, o x 2 layers
    after = dict(model.named_parameters())
    nf4 = {n for n, p in after.items() if isinstance(p, NF4Tensor)}
    # attention and experts in NF4; routers, embeddings, norms and the LM head untouched
    assert nf4 and all("_proj" in n for n in nf4)
    kept = {n: p for n, p in after.items() if n not in nf4}
    assert kept.keys() <= before.keys() and all(torch.equal(before[n], p) for n, p in kept.items())
    assert {n.rsplit(".", 2)[-2] for n in kept} >= {"gate", "embed_tokens", "lm_head", "norm"}
    assert all("_proj" not in n for n in kept)
    ids = token_blocks(root / "base", root / "train.jsonl", 1, 2, 24)[0]
    with torch.no_grad():
        got = model(input_ids=ids).logits
        torch.testing.assert_close(got, dequantized(root, model)(input_ids=ids).logits)
        # NF4 is lossy: the logits move, but not far
        assert 0 < (got - load(root)(input_ids=ids).logits).abs().max() < 0.5


def test_adapter_has_peft_s_format_and_loads_on_the_unquantised_model(moe, tmp_path):
    root, _ = moe
    torch.manual_seed(0)
    reference = get_peft_model(load(root), LoraConfig(**LORA))
    reference.save_pretrained(tmp_path / "peft")
    model = load(root)
    quantize_nf4(model)
    model = nf4_lora(model, LoraConfig(**LORA))
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    save_adapter(model, tmp_path / "nf4")
    ours = load_file(tmp_path / "nf4" / "adapter_model.safetensors")
    peft_s = load_file(tmp_path / "peft" / "adapter_model.safetensors")
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in peft_s.items()}
    assert any(".experts.base_layer.lora_A" in k for k in ours)  # both expert parameters
    assert all(v.dtype == torch.float32 for v in ours.values())
    configs = [
        json.loads((tmp_path / d / "adapter_config.json").read_text()) for d in ("nf4", "peft")
    ]
    for config in configs:  # PEFT writes these sets in hash order
        for key in ("target_modules", "target_parameters"):
            config[key] = sorted(config[key])
    assert configs[0] == configs[1]
    # PEFT itself, on the dequantised base, computes what the NF4 model computes
    ids = token_blocks(root / "base", root / "train.jsonl", 1, 2, 24)[0]
    loaded = PeftModel.from_pretrained(dequantized(root, model), tmp_path / "nf4").eval()
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, loaded(input_ids=ids).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert (want - load(root)(input_ids=ids).logits).abs().max() > 0.01  # the adapter acts


def test_staged_loader_builds_the_same_model_layer_by_layer(moe):
    """Read layer by layer from the checkpoint (experts saved one by one) into an empty model: the
    same NF4 weights, LoRA weights and logits as quantising the whole loaded model."""
    root, _ = moe
    staged = load_staged(root / "base", LoraConfig(**LORA), dtype=torch.float32, seed=3)
    model = load(root)
    quantize_nf4(model)
    model = nf4_lora(model, LoraConfig(**LORA), seed=3)
    assert same(nf4_state(staged), nf4_state(model))
    assert all(p.requires_grad == ("lora_" in name) for name, p in staged.named_parameters())
    ids = token_blocks(root / "base", root / "train.jsonl", 1, 2, 24)[0]
    with torch.no_grad():
        assert torch.equal(staged(input_ids=ids).logits, model(input_ids=ids).logits)


def nf4_state(model) -> dict:
    """Every parameter, an NF4 one as its packed data and scales."""
    inner = ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean")
    return {
        name: [getattr(p, t) for t in inner] if isinstance(p, NF4Tensor) else [p]
        for name, p in model.named_parameters()
    }


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        all(torch.equal(x, y) for x, y in zip(a[k], b[k], strict=True)) for k in a
    )


def test_staged_loader_reads_fused_experts_and_ties_embeddings(moe, setup, tmp_path):
    """Experts saved fused (one (E, 2I, H) tensor, as other tools write them) read expert by
    expert; a dense model with tied embeddings keeps them tied."""
    root, _ = moe
    # the in-memory state dict is the fused layout
    fused = {k: v.contiguous() for k, v in load(root).state_dict().items()}
    assert fused["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 64, 32)
    (tmp_path / "fused").mkdir()
    save_file(fused, tmp_path / "fused" / "model.safetensors")
    shutil.copy(root / "base" / "config.json", tmp_path / "fused")
    lora = LoraConfig(**LORA)
    assert same(
        nf4_state(load_staged(tmp_path / "fused", lora, dtype=torch.float32)),
        nf4_state(load_staged(root / "base", lora, dtype=torch.float32)),
    )
    dense_lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    staged = load_staged(setup / "base", dense_lora, dtype=torch.float32)
    model = load(setup)
    assert quantize_nf4(model) == {"linear": 14, "experts": 0}  # 4 attention + 3 MLP, x 2
    model = nf4_lora(model, dense_lora)
    assert same(nf4_state(staged), nf4_state(model))
    inner = staged.get_base_model()
    assert inner.lm_head.weight is inner.model.embed_tokens.weight
    ids = token_blocks(setup / "base", setup / "train.jsonl", 1, 2, 24)[0]
    with torch.no_grad():
        assert torch.equal(staged(input_ids=ids).logits, model(input_ids=ids).logits)


def test_nf4_refuses_what_it_cannot_quantise_or_adapt(moe):
    root, _ = moe
    with pytest.raises(ValueError, match=r"layer: a \(24, 40\) weight cannot be quantised"):
        to_nf4(torch.randn(24, 40), where="layer")
    model = load(root)
    quantize_nf4(model)
    with pytest.raises(ValueError, match="'mlp.experts.up_proj' names no fused expert parameter"):
        nf4_lora(model, LoraConfig(**{**LORA, "target_parameters": ["mlp.experts.up_proj"]}))
    with pytest.raises(ValueError, match="without {'lora_dropout': 0.1}"):
        nf4_lora(model, LoraConfig(**{**LORA, "lora_dropout": 0.1}))


def test_nf4_model_is_under_a_third_of_bf16_with_the_experts(moe, capsys):
    root, _ = moe
    model = load(root, torch.bfloat16)
    layers_bf16, total_bf16 = storage_bytes(model.model.layers), storage_bytes(model)
    quantize_nf4(model)
    layers_nf4, total_nf4 = storage_bytes(model.model.layers), storage_bytes(model)
    with capsys.disabled():
        print(
            f"\nNF4 / bf16: decoder layers {layers_nf4}/{layers_bf16} B "
            f"({layers_nf4 / layers_bf16:.1%}), whole model {total_nf4}/{total_bf16} B "
            f"({total_nf4 / total_bf16:.1%}; embeddings and LM head stay bf16)"
        )
    # the decoder layers are ~95% of a real MoE; here the untied 320-token vocabulary is most of it
    assert layers_nf4 < 0.35 * layers_bf16


@pytest.mark.slow
def test_qlora_on_two_fsdp2_gloo_ranks_matches_one_process(moe, tmp_path):
    """The same 4 rows a step: all in one process (loaded whole, then quantised), or 2 on each of
    2 FSDP2 ranks (loaded by the staged loader)."""
    root, _ = moe
    kwargs = {
        "base": str(root / "base"),
        "dataset": str(root / "train.jsonl"),
        "lora": LORA,
        "steps": 4,
        "rows": 4,
        "seq": 32,
        "lr": 5e-3,
        "seed": 0,
        "threads": 1,
    }
    one = qlora_steps(**kwargs, staged=False, out_dir=str(tmp_path / "one"), log=lambda _: None)
    two = spawn(
        Train.parse({"distributed": {"gpus_per_node": 2}}).layout,
        qlora_steps,
        {**kwargs, "staged": True, "out_dir": str(tmp_path / "two")},
        log=lambda _: None,
        cpus=2,
    )
    assert one["quantized"] == two["quantized"] == {"linear": 8, "experts": 2}
    assert one["routers_unchanged"] and two["routers_unchanged"]
    assert one["losses"][-1] < one["losses"][0]
    # Tolerance: the ranks average two half-batch losses and gradients where one process takes the
    # mean of the whole batch, a float32 rounding difference that a few Adam steps carry on; the
    # bounds leave it room and stay far below what a wrong shard, a lost scale or a missed expert
    # would do.
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)
    a, b = (load_file(tmp_path / d / "adapter_model.safetensors") for d in ("one", "two"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=5e-6)
    assert all(a[k].abs().sum() > 0 for k in a if "lora_B" in k)  # every adapter trained
    tuned = PeftModel.from_pretrained(load(root), tmp_path / "two")
    assert sum("lora_" in n for n, _ in tuned.named_parameters()) == len(b)


@pytest.mark.slow
def test_staged_loader_quantises_each_weight_once_over_the_ranks_bit_for_bit(moe, tmp_path):
    """On 2 FSDP2 gloo ranks each rank quantises half of every weight and they share the codes:
    each rank's NF4 shards equal, bit for bit, the same shards of the whole model quantised in
    one process (the codes, the double-quantised scales, their factors and mean)."""
    root, _ = moe
    got = spawn(
        Train.parse({"distributed": {"gpus_per_node": 2}}).layout,
        staged_shards,
        {"base": str(root / "base"), "lora": LORA, "out_dir": str(tmp_path / "out"), "threads": 1},
        log=lambda _: None,
        cpus=2,
    )
    # q, k, v, o x 2 layers, gate_up and down of 4 experts x 2 layers, on each rank
    assert got["compared"] == [8 + 16, 8 + 16] and got["mismatched"] == []
    shared = [line for line in got["logs"] if "quantised (1/2 of it here), sharded" in line]
    assert len(shared) == 2 * 2  # each of the 2 layers, on each rank


STAGED = {
    "method": "qlora",
    "load_in_4bit": True,
    "quantize_moe_experts": True,
    "lora": {
        "r": 4,
        "alpha": 8,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    },
    "lr": 5e-3,
    "max_steps": 4,
    "max_length": 128,
    "logging_steps": 1,
    "seed": 0,
}


@pytest.mark.slow
def test_train_stage_runs_staged_qlora_on_two_fsdp2_ranks_as_on_one(moe, tmp_path, capfd):
    """``stillroom train`` with quantize_moe_experts: the staged loader's NF4 model under TRL's
    trainer, on one process, on 2 FSDP2 gloo ranks (with gradient checkpointing), and on 2 ranks
    with expert parallelism, with the same global batch; the adapter saved in PEFT's format
    without the router."""
    root, _ = moe
    logs: dict[str, list[str]] = {"one": [], "two": [], "ep": []}
    runs = {}
    for name, extra in (
        ("one", {"batch_size": 4}),
        (
            "two",
            {
                "batch_size": 2,
                "gradient_checkpointing": True,
                "distributed": {"gpus_per_node": 2, "fsdp_size": 2},
            },
        ),
        # each rank holds 2 of the 4 experts whole; tokens go to them by all-to-all
        ("ep", {"batch_size": 2, "distributed": {"gpus_per_node": 2, "expert_parallel_size": 2}}),
    ):
        runs[name] = train_stage(
            base=str(root / "base"),
            dataset=str(root / "train.jsonl"),
            out_model=str(tmp_path / name),
            params={**STAGED, **extra},
            threads=2,
            log=logs[name].append,
        )
    one, two, ep = runs["one"], runs["two"], runs["ep"]
    assert one["world_size"] == 1 and two["world_size"] == 2 and one["steps"] == two["steps"] == 4
    # the workers' log lines go to the job's stderr
    err = capfd.readouterr().err
    assert "[rank 0] layer 1: read, quantised (1/2 of it here), sharded" in err
    assert "[rank 0] NF4 model: 8 linear layers, 2 experts modules, 2-way expert parallel" in err
    # each rank holds half of the experts
    assert ep["four_bit_weights"] == {"attention": 8, "experts": 8, "other": 0}
    assert any("8 linear layers, 2 experts modules" in line for line in logs["one"])
    assert one["trainable"]["experts"] > 0 and one["trainable"]["attention"] > 0
    # q, k, v, o x 2 layers; gate_up and down of 4 experts x 2 layers (each expert its own)
    assert (
        one["four_bit_weights"]
        == two["four_bit_weights"]
        == {
            "attention": 8,
            "experts": 16,
            "other": 0,
        }
    )
    assert one["losses"][-1] < one["losses"][0]
    # Tolerance: the ranks sum their gradients in another order, float32 rounding; Adam turns a
    # near-zero gradient's rounding into up to a step of lr, so the adapters are compared within
    # lr / 20.
    a = load_file(tmp_path / "one" / "adapter_model.safetensors")
    assert not [k for k in a if ".gate." in k]
    for name in ("two", "ep"):
        assert runs[name]["losses"] == pytest.approx(one["losses"], rel=1e-5)
        b = load_file(tmp_path / name / "adapter_model.safetensors")
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=1e-3, atol=STAGED["lr"] / 20)
        tuned = PeftModel.from_pretrained(load(root), tmp_path / name)
        assert sum("lora_" in n for n, _ in tuned.named_parameters()) == len(b)


@pytest.mark.slow
def test_expert_parallel_dispatch_matches_the_whole_experts_when_a_rank_gets_no_row(tmp_path):
    """Every row routed to rank 0's experts: rank 1 runs none, yet the outputs, the input
    gradients and the LoRA gradients (summed over ranks) equal one module holding every expert,
    and nothing hangs."""
    diffs = spawn(
        Train.parse({"distributed": {"gpus_per_node": 2}}).layout,
        skewed_dispatch,
        {"out_dir": str(tmp_path / "out"), "threads": 1},
        log=lambda _: None,
        cpus=2,
    )
    # relative to the largest value: float32 rounding of the same products summed in another order
    assert max(diffs.values()) < 1e-5, diffs


@pytest.mark.slow
def test_killed_staged_qlora_resumes_from_its_adapter_checkpoint(moe, tmp_path):
    """A sharded checkpoint of a QLoRA job holds the adapter and its optimizer state, not the
    frozen NF4 base: a job killed after one resumes to the adapter of an uninterrupted run."""
    root, _ = moe
    params = {
        **STAGED,
        "max_steps": 6,
        "batch_size": 2,
        "save_steps": 2,
        "distributed": {"gpus_per_node": 2, "fsdp_size": 2},
    }
    straight, out = kill_and_resume(
        root / "base", root / "train.jsonl", params, tmp_path, kill_at=4
    )
    a = load_file(straight / "adapter_model.safetensors")
    b = load_file(out / "adapter_model.safetensors")
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6


def test_layers_are_placed_over_devices_as_a_balanced_device_map_places_them():
    """Consecutive layers per device, balanced by bytes with the embeddings on the first and the
    LM head on the last; a device over its budget refused, naming it."""
    from stillroom.runtime.nf4 import place_layers

    assert place_layers([10] * 8, {0: 100, 1: 100}) == [0] * 4 + [1] * 4
    # the embeddings' 20 bytes push a layer to the second GPU, the head's to the first
    assert place_layers([10] * 8, {0: 100, 1: 100}, first=20) == [0] * 3 + [1] * 5
    assert place_layers([10] * 8, {0: 100, 1: 100}, last=20) == [0] * 5 + [1] * 3
    assert place_layers([10] * 6, {"cpu": 100}) == ["cpu"] * 6
    with pytest.raises(ValueError, match=r"1 would hold 0.00 GiB of 0.00"):
        place_layers([10] * 8, {0: 100, 1: 30})


def test_staged_loader_under_a_device_map_builds_the_same_model(moe):
    """One process, the layers placed by max_memory (here all on the CPU, this machine's one
    device): the same NF4 weights, LoRA weights and logits as the whole model quantised, and the
    map the Trainer reads (hf_device_map)."""
    root, _ = moe
    lines = []
    staged = load_staged(
        root / "base",
        LoraConfig(**LORA),
        dtype=torch.float32,
        seed=3,
        max_memory={"cpu": 2**30},
        log=lines.append,
    )
    model = load(root)
    quantize_nf4(model)
    model = nf4_lora(model, LoraConfig(**LORA), seed=3)
    assert same(nf4_state(staged), nf4_state(model))
    assert "layer 1: read, quantised on cpu" in lines
    assert set(staged.hf_device_map.values()) == {"cpu"}
    assert {"model.layers.0", "model.layers.1", "lm_head"} <= staged.hf_device_map.keys()
    ids = token_blocks(root / "base", root / "train.jsonl", 1, 2, 24)[0]
    with torch.no_grad():
        assert torch.equal(staged(input_ids=ids).logits, model(input_ids=ids).logits)


def test_nf4_experts_under_a_device_map_are_a_config_the_staged_loader_takes():
    """The guide's beam-qlora-experts-mp: NF4 experts spread by device_map auto (refused before);
    an explicit map is refused, since the staged loader places the layers itself."""
    mp = {k: v for k, v in STAGED.items() if k != "seed"}  # the stage's, not train's
    mp |= {"device_map": "auto", "gpu_memory_limit": "125GiB"}
    mp["distributed"] = {"gpus_per_node": 8}
    assert Train.parse(mp).layout.world_size == 1
    with pytest.raises(ConfigError, match=r"device_map: \{'': 0\} with quantize_moe_experts"):
        Train.parse({**mp, "device_map": {"": 0}})


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="a device map over GPUs needs 2 GPUs")
def test_staged_loader_spreads_the_layers_over_two_gpus(moe):
    root, _ = moe
    staged = load_staged(
        root / "base",
        LoraConfig(**LORA),
        dtype=torch.bfloat16,
        max_memory={0: 2**30, 1: 2**30},
    )
    assert staged.hf_device_map["model.layers.0"] == 0
    assert staged.hf_device_map["model.layers.1"] == 1
    ids = token_blocks(root / "base", root / "train.jsonl", 1, 2, 24)[0].to("cuda:0")
    loss = staged(input_ids=ids, labels=ids).loss
    loss.backward()
    assert all(p.grad is not None for p in staged.parameters() if p.requires_grad)
