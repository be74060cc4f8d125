"""LoRA on attention and fused MoE experts of a tiny random Qwen3-MoE; the router is never
adapted."""

import inspect
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from stillroom.config import Lora, Train
from stillroom.runtime.adapter_merge import stream_merge
from stillroom.runtime.adapters import check_saved_adapter, meta_model, resolve_targets, routers
from stillroom.runtime.sft import train_sft

from ..conftest import MOE


def _train(root, out, params):
    """SFT of the tiny MoE in ``root`` on its dataset, quietly, with seed 0."""
    return train_sft(
        root / "base", root / "train.jsonl", out, params=params, seed=0, log=lambda _: None
    )


LORA = {
    "r": 4,
    "alpha": 8,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
}


def test_lora_trains_attention_and_experts_but_never_the_router(moe, tmp_path):
    root, _ = moe
    params = {
        "method": "lora",
        "lora": LORA,
        "lr": 5e-3,
        "max_steps": 12,
        "batch_size": 2,
        "max_length": 128,
        "logging_steps": 4,
    }
    m = _train(root, tmp_path / "sft", params)
    assert (
        m["trainable"]["attention"] > 0
        and m["trainable"]["experts"] > 0
        and m["trainable"]["other"] == 0
    )
    assert m["adapter_bytes"] == 4 * m["trainable_total"] and m["final_loss"] < m["first_loss"]
    assert m["four_bit_weights"] == {"attention": 0, "experts": 0, "other": 0}
    # the training job saves the adapter alone (with what the merged model is served with); the
    # merge is a job of its own
    assert not (tmp_path / "sft" / "model.safetensors").exists()
    assert (tmp_path / "sft" / "generation_config.json").exists()
    adapter = load_file(tmp_path / "sft" / "adapter_model.safetensors")
    lora_b = {k: v for k, v in adapter.items() if "lora_B" in k}
    assert lora_b and all(
        v.abs().sum() > 0 for v in lora_b.values()
    )  # every adapter got gradients (B starts at 0)
    stream_merge(root / "base", tmp_path / "sft", tmp_path / "merged")
    base, tuned = (
        load_file(root / "base" / "model.safetensors"),
        load_file(tmp_path / "merged" / "model.safetensors"),
    )
    assert set(base) == set(tuned)
    routers = [k for k in base if k.endswith("mlp.gate.weight")]
    assert routers and all(torch.equal(base[k], tuned[k]) for k in routers)
    assert any(not torch.equal(base[k], tuned[k]) for k in base if ".experts." in k)
    assert any(not torch.equal(base[k], tuned[k]) for k in base if "q_proj" in k)


def test_router_override_and_unresolvable_targets(moe):
    root, _ = moe
    assert Train.parse(
        {"method": "lora", "lora": {**LORA, "target_modules": ["mlp.gate"], "allow_router": True}}
    ).lora
    with pytest.raises(ValueError, match="target_modules: 'qproj' matches nothing"):
        resolve_targets(root / "base", Lora.parse({**LORA, "target_modules": ["qproj"]}))
    # a transformers-4 per-expert name, which PEFT would turn into LoRA on the fused experts at
    # twice the rank without a word, is refused with the spelling to use
    with pytest.raises(ValueError, match="down_proj' matches nothing.*experts are fused"):
        resolve_targets(root / "base", Lora.parse({**LORA, "target_modules": ["down_proj"]}))
    resolve_targets(root / "base", Lora.parse(LORA))


def unchecked(**targets) -> Lora:
    """A Lora past the config's spelling check (allowed, then the allowance taken back), so that
    the check on the model is tested on its own."""
    lora = Lora.parse({**LORA, **targets, "allow_router": True})
    return lora.model_copy(update={"allow_router": False})


@pytest.mark.parametrize(
    "kind, target, reached",
    [
        ("target_modules", "mlp.gate", "model.layers.0.mlp.gate"),
        ("target_modules", "gate", "model.layers.0.mlp.gate"),
        ("target_modules", "layers.1.mlp.gate", "model.layers.1.mlp.gate"),
        ("target_parameters", "gate.weight", "model.layers.0.mlp.gate.weight"),
        ("target_parameters", "mlp.gate.weight", "model.layers.0.mlp.gate.weight"),
        # spellings no config check can read as the router: what they resolve to is checked
        ("target_parameters", "weight", "model.layers.0.mlp.gate.weight"),
        ("target_modules", "model.layers.0.mlp.gate", "model.layers.0.mlp.gate"),
    ],
)
def test_a_target_resolving_to_the_router_is_refused_on_the_model(moe, kind, target, reached):
    root, _ = moe
    lora = unchecked(**{kind: [target]})
    with pytest.raises(ValueError) as err:
        resolve_targets(root / "base", lora)
    router = re.escape(reached.removesuffix(".weight"))
    assert re.search(
        rf"train.lora.{kind}: '{re.escape(target)}' reaches {re.escape(reached)} of the "
        rf"router {router} \(Qwen3MoeTopKRouter\)(, and \d+ more like it)?; adapting it "
        r"destabilises routing. Set train.lora.allow_router: true to do it anyway",
        str(err.value),
    ), str(err.value)
    allowed = lora.model_copy(update={"allow_router": True})
    assert reached in resolve_targets(root / "base", allowed)[target]


def test_routers_by_class_and_by_name_beside_the_experts(moe, tmp_path):
    """Qwen3-MoE's router is a TopKRouter class; a router that is a plain nn.Linear named gate in
    an MoE block (older transformers, other families) is found by its name; a dense layer's
    gate_proj, and the experts' gate_up_proj, are not routers."""
    from torch import nn
    from transformers import AutoConfig

    root, _ = moe
    config = AutoConfig.from_pretrained(root / "base")
    config.mlp_only_layers = [0]  # layer 0 dense (gate_proj), layer 1 MoE
    config.save_pretrained(tmp_path / "mixed")
    lora = unchecked(target_modules=["gate_proj", "up_proj", "down_proj"], target_parameters=[])
    hits = resolve_targets(tmp_path / "mixed", lora)
    assert hits["gate_proj"] == ["model.layers.0.mlp.gate_proj"]
    ok = unchecked(target_parameters=["gate_up_proj", "mlp.experts.down_proj"])
    assert resolve_targets(tmp_path / "mixed", ok)["gate_up_proj"] == [
        "model.layers.1.mlp.experts.gate_up_proj"
    ]
    assert routers(meta_model(tmp_path / "mixed")) == {
        "model.layers.1.mlp.gate": "Qwen3MoeTopKRouter"
    }

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(4, 8, 8))

    class SparseBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(8, 4)
            self.experts = Experts()

    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(8, 8)  # a GLU's gate, not a router: no experts beside it
            self.router = nn.Sequential(nn.Linear(8, 4))

    net = nn.ModuleDict({"moe": SparseBlock(), "dense": Dense()})
    found = routers(net)
    assert found == {"moe.gate": "Linear"}


def test_a_router_adapter_trains_only_when_allowed_and_the_saved_check_catches_it(moe, tmp_path):
    """allow_router lets gate.weight through, and then the router does change (what the guard
    keeps from happening); the check of the saved adapter refuses that adapter without the
    allowance, independently of the checks before training."""
    root, _ = moe
    lora = {**LORA, "target_modules": ["q_proj"], "target_parameters": ["gate.weight"]}
    params = {
        "method": "lora",
        "lora": {**lora, "allow_router": True},
        "lr": 5e-3,
        "max_steps": 4,
        "batch_size": 2,
        "max_length": 128,
        "logging_steps": 4,
    }
    _train(root, tmp_path / "sft", params)
    adapter = tmp_path / "sft"
    names = list(load_file(adapter / "adapter_model.safetensors"))
    assert any(".mlp.gate." in n for n in names), names
    stream_merge(root / "base", adapter, tmp_path / "merged")
    base, tuned = (
        load_file(root / "base" / "model.safetensors"),
        load_file(tmp_path / "merged" / "model.safetensors"),
    )
    routers_ = [k for k in base if k.endswith("mlp.gate.weight")]
    assert routers_ and all(not torch.equal(base[k], tuned[k]) for k in routers_)
    check_saved_adapter(adapter, root / "base", Lora.parse({**lora, "allow_router": True}))
    with pytest.raises(ValueError, match=r"the adapter holds router tensors \(base_model\.model"):
        check_saved_adapter(adapter, root / "base", unchecked(**lora))


QLORA = {"method": "qlora", "load_in_4bit": True, "lora": {**LORA, "target_parameters": []}}


def test_qlora_every_trainable_parameter_gets_a_gradient_after_an_eval_forward(moe):
    """The AVX512-BF16 trap: a no-grad eval forward repacks NF4 weights into a kernel without
    autograd."""
    import bitsandbytes as bnb
    from peft import get_peft_model

    from stillroom.runtime.adapters import lora_config
    from stillroom.runtime.sft import load_model

    root, _ = moe
    p = Train.parse(QLORA)
    model = load_model(root / "base", p)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and all(not m.support_avx512bf16_for_cpu for m in layers)
    model = get_peft_model(model, lora_config(p.lora))
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    model.eval()
    with torch.no_grad():  # as a generate or an evaluation between steps would
        model(input_ids=ids)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    trainable = {n: q for n, q in model.named_parameters() if q.requires_grad}
    assert trainable and all(".experts." not in n for n in trainable)
    missing = [n for n, q in trainable.items() if q.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert all(q.grad.abs().sum() > 0 for n, q in trainable.items() if "lora_B" in n)


def test_qlora_adapter_merges_onto_the_full_precision_base(moe, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root, _ = moe
    params = {
        **QLORA,
        "lr": 5e-3,
        "max_steps": 8,
        "batch_size": 2,
        "max_length": 128,
        "logging_steps": 4,
    }
    m = _train(root, tmp_path / "sft", params)
    assert m["trainable"]["attention"] > 0 and m["trainable"]["experts"] == 0
    # bitsandbytes quantised the attention projections (4 per layer) and nothing else
    layers = MOE["num_hidden_layers"]
    assert m["four_bit_weights"] == {"attention": 4 * layers, "experts": 0, "other": 0}
    # The merge job's stage: the adapter streamed into the unquantised base.
    from stillroom.cli import main

    argv = ["--base", str(root / "base"), "--adapter", str(tmp_path / "sft")]
    assert main(["merge_adapter", *argv, "--out-model", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not getattr(merged, "is_loaded_in_4bit", False)
    assert all(q.dtype == torch.float32 for q in merged.parameters())
    # The merge is W + BA on the unquantised base, identical to applying the adapter to it at run
    # time.
    base = AutoModelForCausalLM.from_pretrained(root / "base")
    with_adapter = PeftModel.from_pretrained(base, tmp_path / "sft").eval()
    ids = torch.randint(0, merged.config.vocab_size, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits, with_adapter(input_ids=ids).logits, rtol=1e-5, atol=1e-5
        )
    tuned = load_file(tmp_path / "merged" / "model.safetensors")
    assert any(
        not torch.equal(load_file(root / "base" / "model.safetensors")[k], tuned[k])
        for k in tuned
        if "q_proj" in k
    )
    prov = json.loads((tmp_path / "merged.prov.json").read_text())
    assert prov["stage"] == "merge_adapter" and prov["metrics"]["tensors_merged"] == 2 * 4
    # The same adapter onto the same base merges to the same bytes.
    assert main(["merge_adapter", *argv, "--out-model", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (
        tmp_path / "merged" / "model.safetensors"
    ).read_bytes()


def test_a_target_that_matches_nothing_is_shown_names_it_could_take(moe):
    """The hint lists suffixes PEFT would match on this model (self_attn.q_proj, mlp.gate,
    experts.gate_up_proj), never the root's empty name nor a layer index."""
    root, _ = moe
    for kind, targets, named in (
        ("target_modules", {"target_modules": ["qproj"]}, "self_attn.q_proj"),
        ("target_parameters", {"target_parameters": ["experts.gateup"]}, "experts.gate_up_proj"),
    ):
        with pytest.raises(ValueError) as err:
            resolve_targets(root / "base", Lora.parse({**LORA, **targets}))
        found = re.search(rf"{kind}: '.*' matches nothing in .* \(its \w+: (.*)\)$", str(err.value))
        assert found, str(err.value)
        shown = found[1].split(", ")
        assert named in shown and all(s and not s.isdigit() for s in shown), shown
        # each is a name of the model: a target written as shown matches
        model = meta_model(root / "base")
        pool = [n for n, _ in model.named_modules()] + [n for n, _ in model.named_parameters()]
        assert all(any(n == s or n.endswith("." + s) for n in pool) for s in shown), shown


QWEN2_MOE = {
    "vocab_size": 320,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory):
    """A tiny random Qwen2-MoE (transformers' Qwen2MoeForCausalLM): routed experts behind
    mlp.gate, and a shared expert weighed per token by mlp.shared_expert_gate."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    out = tmp_path_factory.mktemp("qwen2_moe")
    torch.manual_seed(0)
    Qwen2MoeForCausalLM(Qwen2MoeConfig(**QWEN2_MOE)).save_pretrained(out)
    return out


@pytest.mark.parametrize(
    "kind, target, reached",
    [
        ("target_modules", "shared_expert_gate", "model.layers.0.mlp.shared_expert_gate"),
        ("target_modules", "mlp.shared_expert_gate", "model.layers.0.mlp.shared_expert_gate"),
        (
            "target_parameters",
            "shared_expert_gate.weight",
            "model.layers.0.mlp.shared_expert_gate.weight",
        ),
        ("target_modules", "1.mlp.shared_expert_gate", "model.layers.1.mlp.shared_expert_gate"),
    ],
)
def test_the_shared_expert_gate_is_a_router_on_a_qwen2_moe(qwen2_moe, kind, target, reached):
    """Qwen2-MoE's shared_expert_gate is refused as the NF4 loader and the GPU check already
    treat it (kept whole, never adapted), while the shared expert's own projections are not."""
    assert routers(meta_model(qwen2_moe)) == {
        f"model.layers.{i}.mlp.{name}": cls
        for i in range(2)
        for name, cls in (("gate", "Qwen2MoeTopKRouter"), ("shared_expert_gate", "Linear"))
    }
    other = (
        {"target_parameters": []} if kind == "target_modules" else {"target_modules": ["q_proj"]}
    )
    lora = unchecked(**{**other, kind: [target]})
    with pytest.raises(ValueError) as err:
        resolve_targets(qwen2_moe, lora)
    gate = reached.removesuffix(".weight")
    assert re.search(
        rf"train.lora.{kind}: '{re.escape(target)}' reaches {re.escape(reached)} of the shared "
        rf"expert's gate {re.escape(gate)} \(Linear\)(, and 1 more like it)?; adapting it "
        "destabilises routing",
        str(err.value),
    ), str(err.value)
    allowed = lora.model_copy(update={"allow_router": True})
    assert reached in resolve_targets(qwen2_moe, allowed)[target]
    shared = unchecked(target_modules=["shared_expert.gate_proj", "shared_expert.up_proj"])
    assert resolve_targets(qwen2_moe, shared.model_copy(update={"target_parameters": []}))


def test_one_router_list_for_the_config_the_adapters_nf4_and_the_gpu_check(qwen2_moe, tmp_path):
    """An adapter on a Qwen2-MoE's shared_expert_gate (allowed, then saved) is caught by the saved
    adapter check; the GPU check counts exactly the router and shared gate weights of the
    checkpoint, and the NF4 loader skips the same names."""
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from stillroom.config.routers import ROUTER_NAMES
    from stillroom.gpucheck.flagship import _is_router
    from stillroom.runtime import nf4

    model = AutoModelForCausalLM.from_pretrained(qwen2_moe)
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["shared_expert_gate"]))
    peft.save_pretrained(tmp_path / "adapter")
    lora = Lora.parse({**LORA, "target_modules": ["shared_expert_gate"], "allow_router": True})
    check_saved_adapter(tmp_path / "adapter", qwen2_moe, lora)
    with pytest.raises(ValueError, match=r"holds router tensors .*shared_expert_gate\.lora_A"):
        check_saved_adapter(tmp_path / "adapter", qwen2_moe, unchecked(**lora.dump()))
    with safe_open(qwen2_moe / "model.safetensors", framework="pt") as fh:
        flagged = {k for k in fh.keys() if _is_router(k)}
    assert flagged == {
        f"model.layers.{i}.mlp.{name}.weight"
        for i in range(2)
        for name in ("gate", "shared_expert_gate")
    }
    assert nf4.ROUTER_NAMES is ROUTER_NAMES
    assert inspect.signature(nf4.quantize_nf4).parameters["skip"].default is ROUTER_NAMES
