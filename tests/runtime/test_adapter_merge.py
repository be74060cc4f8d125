"""The streaming adapter merge on the tiny Qwen3-MoE: a real PEFT adapter on attention
(target_modules) and on the fused experts (target_parameters), every lora_B non-zero, merged shard
by shard into a checkpoint that stores one tensor per expert (as transformers 5 saves it) or the
fused stacks."""

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from stillroom.runtime.adapter_merge import stream_merge
from stillroom.runtime.hooks import WeightHooks
from stillroom.runtime.merge import shard_map

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# float32 end to end: the merged model's logits against the adapter applied at run time
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _base(src, out, dtype=torch.float32, **save_kwargs):
    """The fixture's base model re-saved in ``dtype`` (and shards, with max_shard_size)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
    model.save_pretrained(out, **save_kwargs)
    for f in src.iterdir():  # the tokenizer and generation config beside the weights
        if f.name.startswith(("tokenizer", "generation", "chat_template")):
            shutil.copy2(f, out / f.name)
    return out


def _adapter(base, out, seed=0, **lora):
    """A PEFT adapter for ``base`` with random factors (B too: a fresh B is zero and a merge of it
    would change nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = {
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ATTENTION,
        "target_parameters": EXPERTS,
        **lora,
    }
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(**config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(out)
    return out


def _logits(model, seed=0):
    ids = torch.randint(
        0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        return model(input_ids=ids).logits


def _peft_merged(base, adapter, dtype=torch.float32):
    """PEFT's own merge of the adapter, in memory: the state dict to compare with."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    return PeftModel.from_pretrained(model, adapter).merge_and_unload().state_dict()


def _tensors(model_dir):
    out = {}
    for key, shard in shard_map(model_dir).items():
        with safe_open(model_dir / shard, framework="pt") as fh:
            out[key] = fh.get_tensor(key)
    return out


def _raw(model_dir, key):
    """The stored bytes of tensor ``key``."""
    shard = model_dir / shard_map(model_dir)[key]
    with open(shard, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        begin, end = json.loads(fh.read(n))[key]["data_offsets"]
        fh.seek(8 + n + begin)
        return fh.read(end - begin)


@pytest.fixture(scope="module")
def merged(moe, tmp_path_factory):
    """The fixture's base (one tensor per expert on disk), an adapter with PEFT's per-module
    patterns and rsLoRA, and the streamed merge."""
    root, _ = moe
    tmp = tmp_path_factory.mktemp("merged")
    adapter = _adapter(
        root / "base",
        tmp / "adapter",
        use_rslora=True,
        rank_pattern={"q_proj": 2, "gate_up_proj": 6},
        alpha_pattern={"down_proj": 3, "o_proj": 5},
    )
    summary = stream_merge(root / "base", adapter, tmp / "out")
    return root / "base", adapter, tmp / "out", summary


@pytest.mark.slow
def test_merged_logits_equal_the_adapter_models(merged):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, adapter, out, summary = merged
    on_disk = shard_map(base)
    assert any(".experts.0.gate_proj." in k for k in on_disk)  # one tensor per expert on disk
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    model = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(_logits(model), _logits(with_adapter.eval()), **TOL)
    # and the weights are PEFT's own merge of it
    loaded, reference = model.state_dict(), _peft_merged(base, adapter)
    assert loaded.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=1e-6, msg=key)
    # 2 layers: 4 attention projections and 4 experts x (gate, up, down) each
    assert summary["adapted_parameters"] == 2 * (4 + 2)
    assert summary["tensors_merged"] == summary["tensors_changed"] == 2 * (4 + 4 * 3)


def test_untargeted_tensors_are_copied_byte_for_byte(merged):
    base, _, out, _ = merged
    before, after = _tensors(base), _tensors(out)
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(any(p in k for p in ATTENTION) or ".experts." in k for k in changed), (
        changed
    )
    routers = [k for k in before if k.endswith("mlp.gate.weight")]
    assert routers and not changed & set(routers)
    for key in before.keys() - changed:
        assert _raw(base, key) == _raw(out, key), key
    # every targeted tensor changed: each expert's gate, up and down, each attention projection
    assert {k for k in before if ".experts." in k or any(p in k for p in ATTENTION)} == changed


def test_config_tokenizer_and_the_adapter_travel_with_the_weights(merged):
    base, adapter, out, _ = merged
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (base / name).read_bytes(), name
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (out / "adapter" / name).read_bytes() == (adapter / name).read_bytes()
    assert not (out / "README.md").exists()  # PEFT's model card stays with the adapter


def test_output_is_sharded_exactly_like_the_input(moe, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root, _ = moe
    base = _base(root / "base", tmp_path / "base", max_shard_size="20KB")
    index = json.loads((base / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3
    adapter = _adapter(base, tmp_path / "adapter", seed=1)
    summary = stream_merge(base, adapter, tmp_path / "out")
    out = tmp_path / "out"
    assert summary["shards"] == len(shards)
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    assert json.loads((out / "model.safetensors.index.json").read_text()) == index
    for shard in shards:
        with (
            safe_open(base / shard, framework="pt") as a,
            safe_open(out / shard, framework="pt") as b,
        ):
            assert list(a.keys()) == list(b.keys()) and a.metadata() == b.metadata()
        assert (base / shard).stat().st_size == (out / shard).stat().st_size
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    torch.testing.assert_close(
        _logits(AutoModelForCausalLM.from_pretrained(out)), _logits(with_adapter.eval()), **TOL
    )


def test_bf16_base_merged_in_float32_and_stored_in_bf16(moe, tmp_path):
    """Each merged tensor is the float32 sum rounded once to bf16 (PEFT's in-place merge rounds the
    delta to bf16 first); untouched tensors stay as they were."""
    root, _ = moe
    base = _base(root / "base", tmp_path / "base", dtype=torch.bfloat16)
    adapter = _adapter(base, tmp_path / "adapter", seed=2)
    stream_merge(base, adapter, tmp_path / "out")
    before, after = _tensors(base), _tensors(tmp_path / "out")
    assert all(t.dtype == torch.bfloat16 for t in after.values())
    # PEFT's merge on the bf16 weights held in float32 (exact), then rounded once
    reference = _peft_merged(base, adapter, dtype=torch.float32)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.bfloat16)
    exact = total = 0
    for key, value in loaded.state_dict().items():
        expected = reference[key].to(torch.bfloat16)
        # float32 sums in another order may round to the neighbouring bf16 value: one ulp
        torch.testing.assert_close(value, expected, rtol=2**-7, atol=0, msg=key)
        exact, total = exact + (value == expected).sum().item(), total + value.numel()
    assert exact / total > 0.99
    routers = [k for k in before if k.endswith("mlp.gate.weight")]
    assert all(torch.equal(before[k], after[k]) for k in routers)


def test_fused_expert_stacks_on_disk_are_merged_expert_by_expert(moe, tmp_path):
    """A checkpoint that stores the experts as the model holds them (experts x out x in)."""
    from transformers import AutoModelForCausalLM

    root, _ = moe
    model = AutoModelForCausalLM.from_pretrained(root / "base")
    fused = tmp_path / "fused"
    fused.mkdir()
    model.config.save_pretrained(fused)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, fused / "model.safetensors", metadata={"format": "pt"})
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in shard_map(fused))
    adapter = _adapter(root / "base", tmp_path / "adapter", seed=3)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(fused)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    stream_merge(fused, adapter, tmp_path / "out")
    assert shard_map(tmp_path / "out").keys() == shard_map(fused).keys()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    reference = _peft_merged(root / "base", adapter)
    for key, value in reference.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=1e-6, msg=key)


def test_weight_hooks_apply_to_the_merged_tensors(merged, tmp_path):
    base, adapter, _, _ = merged
    hooks = WeightHooks([{"fn": "renorm_rows", "match": [r"self_attn\.q_proj\.weight$"]}])
    stream_merge(base, adapter, tmp_path / "out", hooks=hooks)
    after = _tensors(tmp_path / "out")
    q = [k for k in after if k.endswith("q_proj.weight")]
    assert q and all(
        torch.allclose(after[k].norm(dim=-1), torch.ones(after[k].shape[0])) for k in q
    )
    bad = WeightHooks([{"fn": "renorm_rows", "match": [r"nowhere\.weight$"]}])
    with pytest.raises(ValueError, match=r"weight_hooks\[0\]\.match: 'nowhere"):
        stream_merge(base, adapter, tmp_path / "again", hooks=bad)
    assert not (tmp_path / "again").exists()


def test_adapter_tensors_matching_nothing_are_refused(merged, tmp_path):
    base, adapter, _, _ = merged
    renamed = tmp_path / "renamed"
    shutil.copytree(adapter, renamed)
    with safe_open(adapter / "adapter_model.safetensors", framework="pt") as fh:
        tensors = {k.replace("q_proj", "query"): fh.get_tensor(k) for k in fh.keys()}
    save_file(tensors, renamed / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=r"4 of its tensors match nothing there .*query") as err:
        stream_merge(base, renamed, tmp_path / "out")
    assert "tensors its config targets are missing" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_an_adapter_for_another_base_is_refused(moe, merged, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    root, _ = moe
    base, adapter, _, _ = merged
    # the same architecture, another checkpoint: the adapter names the base it was trained on
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    with pytest.raises(ValueError, match=r"base_model_name_or_path is .*not the base given"):
        stream_merge(copy, adapter, tmp_path / "out")
    # another shape (wider model): caught on the adapter's tensors
    config = Qwen3MoeConfig.from_pretrained(base)
    config.hidden_size = 48
    wide = tmp_path / "wide"
    AutoModelForCausalLM.from_config(config).save_pretrained(wide)
    moved = tmp_path / "moved"
    shutil.copytree(adapter, moved)
    cfg = json.loads((moved / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "elsewhere/base"  # not a local directory: nothing to compare
    (moved / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ValueError,
        match=r"does not fit base .*wide: .* is \[[\d, ]+\] in the adapter, \[[\d, ]+\] for",
    ):
        stream_merge(wide, moved, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("use_dora", True, "use_dora is True, which the streaming merge does not support"),
        ("lora_bias", True, "lora_bias is True"),
        ("modules_to_save", ["lm_head"], "modules_to_save is"),
        ("peft_type", "IA3", "peft_type is 'IA3'; only LoRA adapters"),
    ],
)
def test_merges_other_than_lora_are_refused_by_name(merged, tmp_path, key, value, message):
    base, adapter, _, _ = merged
    other = tmp_path / "other"
    shutil.copytree(adapter, other)
    cfg = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(ValueError, match=message):
        stream_merge(base, other, tmp_path / "out")


def test_a_quantized_base_is_refused(merged, tmp_path):
    """The merge targets the full-precision checkpoint, never 4-bit weights."""
    base, adapter, _, _ = merged
    nf4 = tmp_path / "nf4"
    shutil.copytree(base, nf4)
    config = json.loads((nf4 / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (nf4 / "config.json").write_text(json.dumps(config))
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    moved = tmp_path / "adapter"
    shutil.copytree(adapter, moved)
    (moved / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": None}))
    with pytest.raises(ValueError, match=r"quantization_config \(bitsandbytes\) is set: merge the"):
        stream_merge(nf4, moved, tmp_path / "out")


def test_bad_directories(merged, tmp_path):
    base, adapter, _, _ = merged
    with pytest.raises(FileNotFoundError, match="not a PEFT adapter: expected adapter_config.json"):
        stream_merge(base, base, tmp_path / "out")
    with pytest.raises(ValueError, match="must differ from the base and the adapter"):
        stream_merge(base, adapter, base)
