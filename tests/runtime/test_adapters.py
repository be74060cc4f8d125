"""LoRA on attention and fused MoE experts of a tiny random Qwen3-MoE; the router is never
adapted."""

import json

import pytest
import torch
from safetensors.torch import load_file

from stillroom.config import Lora, Train
from stillroom.runtime.adapter_merge import stream_merge
from stillroom.runtime.adapters import resolve_targets
from stillroom.stages.train import train_sft

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
        "seed": 0,
    }
    m = train_sft(
        root / "base", root / "train.jsonl", tmp_path / "sft", params=params, log=lambda _: None
    )
    assert (
        m["trainable"]["attention"] > 0
        and m["trainable"]["experts"] > 0
        and m["trainable"]["other"] == 0
    )
    assert m["adapter_bytes"] == 4 * m["trainable_total"] and m["final_loss"] < m["first_loss"]
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
    resolve_targets(root / "base", Lora.parse(LORA))


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
    m = train_sft(
        root / "base", root / "train.jsonl", tmp_path / "sft", params=params, log=lambda _: None
    )
    assert m["trainable"]["attention"] > 0 and m["trainable"]["experts"] == 0
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
