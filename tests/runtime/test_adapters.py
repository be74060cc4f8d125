"""LoRA on attention and fused MoE experts of a tiny random Qwen3-MoE; the router is never adapted."""

import pytest
import torch
from safetensors.torch import load_file

from stillroom.adapters import check_lora, resolve_targets
from stillroom.io import write_jsonl
from stillroom.student import build_model, train_tokenizer
from stillroom.train import train_sft

from ..conftest import synthetic_rows

MOE = dict(
    family="qwen3_moe",
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
LORA = {
    "r": 4,
    "alpha": 8,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
}


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    rows = synthetic_rows(120)
    write_jsonl(root / "train.jsonl", rows)
    train_tokenizer(
        [m["content"] for r in rows for m in r["messages"]], root / "tok", vocab_size=320
    )
    m = build_model(root / "tok", root / "base", model=MOE, seed=0)
    return root, m


def test_tiny_moe_builder(moe):
    root, m = moe
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(root / "base")
    assert (
        model.config.model_type == "qwen3_moe"
        and model.config.num_experts == 4
        and m["parameters"] > 0
    )
    assert model.model.layers[0].mlp.experts.gate_up_proj.dim() == 3  # fused experts in memory
    with pytest.raises(ValueError, match="missing model key"):
        build_model(
            root / "tok",
            root / "x",
            model={k: v for k, v in MOE.items() if k != "num_experts"},
            seed=0,
        )


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
    adapter = load_file(tmp_path / "sft" / "adapter" / "adapter_model.safetensors")
    lora_b = {k: v for k, v in adapter.items() if "lora_B" in k}
    assert lora_b and all(
        v.abs().sum() > 0 for v in lora_b.values()
    )  # every adapter got gradients (B starts at 0)
    base, tuned = (
        load_file(root / "base" / "model.safetensors"),
        load_file(tmp_path / "sft" / "model.safetensors"),
    )
    assert set(base) == set(tuned)
    routers = [k for k in base if k.endswith("mlp.gate.weight")]
    assert routers and all(torch.equal(base[k], tuned[k]) for k in routers)
    assert any(not torch.equal(base[k], tuned[k]) for k in base if ".experts." in k)
    assert any(not torch.equal(base[k], tuned[k]) for k in base if "q_proj" in k)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"method": "full", "lora": LORA}, "a full fine-tune has no adapter"),
        ({"method": "lora"}, "needs train.lora"),
        ({"method": "dora", "lora": LORA}, "not one of full, lora, qlora"),
        ({"method": "qlora", "lora": LORA}, "qlora' needs train.load_in_4bit"),
        ({"method": "lora", "lora": LORA, "load_in_4bit": True}, "set method: qlora"),
        ({"method": "full", "load_in_4bit": True}, "4-bit weights cannot be fine-tuned directly"),
        (
            {"method": "qlora", "lora": LORA, "load_in_4bit": "yes"},
            "load_in_4bit must be true or false",
        ),
        (
            {"method": "lora", "lora": {**LORA, "dropout": 0.1}},
            "dropout must be 0 with target_parameters",
        ),
        (
            {"method": "lora", "lora": {**LORA, "target_modules": ["q_proj", "mlp.gate"]}},
            "targets the router",
        ),
        ({"method": "lora", "lora": {**LORA, "rank": 8}}, "unknown key"),
    ],
)
def test_lora_config_fails_before_loading(params, message):
    with pytest.raises(ValueError, match=message):
        check_lora(params)


def test_router_override_and_unresolvable_targets(moe):
    root, _ = moe
    assert check_lora(
        {"method": "lora", "lora": {**LORA, "target_modules": ["mlp.gate"], "allow_router": True}}
    )
    with pytest.raises(ValueError, match="target_modules: 'qproj' matches nothing"):
        resolve_targets(root / "base", {**LORA, "target_modules": ["qproj"]})
    resolve_targets(root / "base", LORA)


QLORA = {"method": "qlora", "load_in_4bit": True, "lora": {**LORA, "target_parameters": []}}


def test_qlora_every_trainable_parameter_gets_a_gradient_after_an_eval_forward(moe):
    """The AVX512-BF16 trap: a no-grad eval forward repacks NF4 weights into a kernel without autograd."""
    import bitsandbytes as bnb
    from peft import get_peft_model

    from stillroom.adapters import lora_config
    from stillroom.train import check_params, load_model

    root, _ = moe
    p = check_params(QLORA)
    model = load_model(root / "base", p)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and all(not m.support_avx512bf16_for_cpu for m in layers)
    model = get_peft_model(model, lora_config(p["lora"]))
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
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    assert not getattr(merged, "is_loaded_in_4bit", False)
    assert all(q.dtype == torch.float32 for q in merged.parameters())
    # The merge is W + BA on the unquantised base, identical to applying the adapter to it at run time.
    base = AutoModelForCausalLM.from_pretrained(root / "base")
    with_adapter = PeftModel.from_pretrained(base, tmp_path / "sft" / "adapter").eval()
    ids = torch.randint(0, merged.config.vocab_size, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits, with_adapter(input_ids=ids).logits, rtol=1e-4, atol=1e-4
        )
    tuned = load_file(tmp_path / "sft" / "model.safetensors")
    assert any(
        not torch.equal(load_file(root / "base" / "model.safetensors")[k], tuned[k])
        for k in tuned
        if "q_proj" in k
    )
    # The standalone stage merges the same adapter onto the same base to the same weights.
    from stillroom.cli import main

    assert (
        main(
            [
                "merge_adapter",
                "--base",
                str(root / "base"),
                "--adapter",
                str(tmp_path / "sft" / "adapter"),
                "--out-model",
                str(tmp_path / "again"),
            ]
        )
        == 0
    )
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert set(again) == set(tuned) and all(torch.equal(again[k], tuned[k]) for k in tuned)


def test_tiny_model_like_a_real_one_keeps_its_architecture(moe, tmp_path):
    """`stillroom tiny` reads only the reference's config and tokenizer (here the tiny MoE stands in for a
    real checkpoint) and shrinks it further, keeping the family and the routing."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from stillroom.cli import main

    root, _ = moe
    params = (
        '{"like": "%s", "shrink": {"num_hidden_layers": 1, "num_experts": 2, "hidden_size": 16}}'
        % (root / "base")
    )
    assert main(["tiny", "--out-model", str(tmp_path / "tiny"), "--params", params]) == 0
    ref, tiny = (
        AutoConfig.from_pretrained(root / "base"),
        AutoConfig.from_pretrained(tmp_path / "tiny"),
    )
    assert tiny.model_type == ref.model_type == "qwen3_moe"
    assert (
        tiny.num_hidden_layers,
        tiny.num_experts,
        tiny.hidden_size,
        tiny.num_experts_per_tok,
    ) == (1, 2, 16, 2)
    assert tiny.vocab_size == ref.vocab_size
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    assert model.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 2
    assert (tmp_path / "tiny" / "tokenizer.json").exists()
    assert (
        main(
            [
                "tiny",
                "--out-model",
                str(tmp_path / "bad"),
                "--params",
                '{"like": "%s", "shrink": {"num_loops": 2}}' % (root / "base"),
            ]
        )
        == 2
    )
