import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from stillroom.runtime.merge import interpolate


def _config(tied: bool, hidden: int = 32) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=300,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=tied,
    )


def _save(path, tied, seed, hidden=32, dtype=torch.float32, **save_kwargs):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(tied, hidden)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():  # norms start at 1: make every tensor differ between models
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, **save_kwargs)
    return {k: v.float().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    made = {}
    for tied in (True, False):
        name = "tied" if tied else "untied"
        base, tuned = root / f"{name}-base", root / f"{name}-tuned"
        made[name] = (
            base,
            tuned,
            _save(base, tied, 0),
            _save(tuned, tied, 1, max_shard_size="40KB"),
        )
        (tuned / "tokenizer_config.json").write_text('{"marker": "tuned"}')
        (tuned / "chat_template.jinja").write_text("{{ tuned }}")
        (base / "tokenizer_config.json").write_text('{"marker": "base"}')
    return made


def _check(out, base_sd, tuned_sd, w, dtype=torch.float32):
    model = AutoModelForCausalLM.from_pretrained(out, dtype=dtype)
    loaded = model.state_dict()
    assert set(loaded) == set(base_sd)
    # float32 rounding may differ in the last bit and flip a bf16 rounding: allow one bf16 ulp there
    rtol = 0 if dtype == torch.float32 else 2**-7
    for key, value in loaded.items():
        expected = ((1 - w) * base_sd[key] + w * tuned_sd[key]).to(dtype).float()
        assert value.dtype == dtype, key
        torch.testing.assert_close(value.float(), expected, atol=1e-6, rtol=rtol, msg=key)
        if dtype != torch.float32:
            assert (value.float() == expected).float().mean() > 0.99, key
    return model


@pytest.mark.parametrize("variant", ["tied", "untied"])
@pytest.mark.parametrize("w", [0.0, 0.3, 1.0])
def test_interpolate_matches_expected(models, tmp_path, variant, w):
    base, tuned, base_sd, tuned_sd = models[variant]
    assert len(list(tuned.glob("*.safetensors"))) > 1  # the tuned input is sharded
    out = tmp_path / "merged"
    summary = interpolate(base, tuned, out, w)
    model = _check(out, base_sd, tuned_sd, w)
    if variant == "tied":
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    else:
        assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert summary["shards"] == 1 and (out / "model.safetensors").exists()
    assert summary["parameters"] == sum(
        t.numel() for k, t in base_sd.items() if not (variant == "tied" and k == "lm_head.weight")
    )
    assert summary["bytes_written"] > 4 * summary["parameters"]
    assert json.loads((out / "tokenizer_config.json").read_text()) == {"marker": "tuned"}
    assert (out / "chat_template.jinja").read_text() == "{{ tuned }}"
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (tuned / "config.json").read_text()
    )
    assert (out / "generation_config.json").exists()
    assert not list(tmp_path.glob(".merged*"))  # no temp dir left behind


def test_sharded_output(models, tmp_path):
    base, tuned, base_sd, tuned_sd = models["untied"]
    out = tmp_path / "merged"
    summary = interpolate(base, tuned, out, 0.5, max_shard_bytes=30_000)
    assert summary["shards"] > 2
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) == summary["shards"]
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    assert not (out / "model.safetensors").exists()
    _check(out, base_sd, tuned_sd, 0.5)


def test_overwrites_previous_output(models, tmp_path):
    base, tuned, base_sd, tuned_sd = models["tied"]
    out = tmp_path / "merged"
    interpolate(base, tuned, out, 0.5, max_shard_bytes=30_000)
    interpolate(base, tuned, out, 0.2)  # one shard now: stale shards and index must be gone
    assert not (out / "model.safetensors.index.json").exists()
    _check(out, base_sd, tuned_sd, 0.2)


def test_bfloat16_computed_in_float32(tmp_path):
    base_sd = _save(tmp_path / "base", True, 0, dtype=torch.bfloat16)
    tuned_sd = _save(tmp_path / "tuned", True, 1, dtype=torch.bfloat16)
    interpolate(tmp_path / "base", tmp_path / "tuned", tmp_path / "out", 0.3)
    _check(tmp_path / "out", base_sd, tuned_sd, 0.3, dtype=torch.bfloat16)


def test_tied_vs_untied_keys_rejected(models, tmp_path):
    base, _, _, _ = models["tied"]
    _, tuned, _, _ = models["untied"]
    with pytest.raises(ValueError, match=r"lm_head\.weight") as err:
        interpolate(base, tuned, tmp_path / "out", 0.5)
    assert str(base) in str(err.value) and str(tuned) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_shape_mismatch_names_key(models, tmp_path):
    base, _, _, _ = models["tied"]
    _save(tmp_path / "wide", True, 3, hidden=48)
    with pytest.raises(ValueError, match=r"tensor \S+: base .* tuned"):
        interpolate(base, tmp_path / "wide", tmp_path / "out", 0.5)
    assert not (tmp_path / "out").exists()


def test_dtype_mismatch_names_key(models, tmp_path):
    base, _, _, _ = models["tied"]
    _save(tmp_path / "bf16", True, 3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"tensor \S+:.*float32.*bfloat16"):
        interpolate(base, tmp_path / "bf16", tmp_path / "out", 0.5)


def test_missing_weights_and_same_output(models, tmp_path):
    base, tuned, _, _ = models["tied"]
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        interpolate(tmp_path, tuned, tmp_path / "out", 0.5)
    with pytest.raises(ValueError, match="must differ"):
        interpolate(base, tuned, tuned, 0.5)
