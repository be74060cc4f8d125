"""Weight hooks after every optimizer step and every merge (nGPT-style row re-normalisation), and
model options sampled per step."""

import pytest
import torch
from safetensors.torch import load_file

from stillroom.config import ConfigError, WeightHook
from stillroom.runtime.hooks import WeightHooks, renorm_rows, sample_options
from stillroom.runtime.merge import interpolate
from stillroom.runtime.sft import train_sft

RENORM = [{"fn": "renorm_rows", "match": [r"self_attn\.q_proj\.weight$"], "dim": -1, "norm": 1.0}]
# A weight hook's default settings (dim -1, norm 1.0, eps 1e-8)
DEFAULTS = WeightHook(fn="renorm_rows", match=["x"]).dump()


def row_norms(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(t.float(), dim=-1)


def test_renorm_rows():
    t = torch.randn(5, 7) * 3
    out = renorm_rows(t, dim=DEFAULTS["dim"], norm=2.0, eps=DEFAULTS["eps"])
    torch.testing.assert_close(row_norms(out), torch.full((5,), 2.0))
    torch.testing.assert_close(
        out / row_norms(out)[:, None], t / row_norms(t)[:, None]
    )  # directions kept
    bf16 = renorm_rows(
        t.bfloat16(), dim=DEFAULTS["dim"], norm=DEFAULTS["norm"], eps=DEFAULTS["eps"]
    )
    assert bf16.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "specs, message",
    [
        ([{"fn": "normalise", "match": ["x"]}], "weight_hooks.0.fn: Input should be 'renorm_rows'"),
        ([{"fn": "renorm_rows", "match": []}], "weight_hooks.0.match: List should have at least 1"),
        ([{"fn": "renorm_rows", "match": ["("]}], "weight_hooks.0.match.0: bad regular expression"),
        ([{"fn": "renorm_rows", "match": ["x"], "axis": 0}], "weight_hooks.0: unknown key 'axis'"),
    ],
)
def test_bad_hook_config_names_the_entry(specs, message):
    with pytest.raises(ConfigError, match=message):
        WeightHooks(specs)


def test_sampled_options_depend_on_seed_and_step_only():
    options = {"num_loops": [1, 2, 4], "width": ["a", "b"]}
    runs = [[sample_options(options, 7, step) for step in range(50)] for _ in range(2)]
    assert runs[0] == runs[1]
    assert {r["num_loops"] for r in runs[0]} == {1, 2, 4} and {r["width"] for r in runs[0]} == {
        "a",
        "b",
    }
    assert runs[0] != [sample_options(options, 8, step) for step in range(50)]


def test_training_renormalises_after_every_step_and_samples_options(setup, tmp_path):
    params = {
        "lr": 5e-3,
        "max_steps": 6,
        "batch_size": 4,
        "max_length": 128,
        "logging_steps": 2,
        "sampled_options": {"initializer_range": [0.01, 0.02, 0.04]},
    }
    m = train_sft(
        setup / "base",
        setup / "train.jsonl",
        tmp_path / "sft",
        params=params,
        seed=0,
        weight_hooks=RENORM,
        log=lambda _: None,
    )
    assert sum(m["sampled_options"]["initializer_range"].values()) == m["steps"] == 6
    tuned = load_file(tmp_path / "sft" / "model.safetensors")
    base = load_file(setup / "base" / "model.safetensors")
    for key, t in tuned.items():
        if key.endswith("self_attn.q_proj.weight"):
            torch.testing.assert_close(row_norms(t), torch.ones(t.shape[0]), rtol=1e-5, atol=1e-5)
        elif key.endswith("self_attn.k_proj.weight"):
            assert not torch.allclose(row_norms(t), torch.ones(t.shape[0]), atol=1e-2)
            assert not torch.equal(t, base[key])  # trained, but left alone by the hook


def test_merge_applies_the_hooks_to_merged_tensors(setup, tmp_path):
    a, b = setup / "base", tmp_path / "tuned"
    train_sft(
        a,
        setup / "train.jsonl",
        b,
        params={"lr": 5e-3, "max_steps": 2, "batch_size": 4, "max_length": 128},
        seed=0,
        log=lambda _: None,
    )
    interpolate(a, b, tmp_path / "plain", 0.5)
    interpolate(a, b, tmp_path / "hooked", 0.5, hooks=WeightHooks(RENORM))
    plain, hooked = (
        load_file(tmp_path / "plain" / "model.safetensors"),
        load_file(tmp_path / "hooked" / "model.safetensors"),
    )
    q = [k for k in plain if k.endswith("q_proj.weight")]
    assert q and all(not torch.allclose(row_norms(plain[k]), torch.ones(1), atol=1e-3) for k in q)
    for k in plain:
        if k in q:
            torch.testing.assert_close(
                row_norms(hooked[k]), torch.ones(hooked[k].shape[0]), rtol=1e-5, atol=1e-5
            )
        else:
            assert torch.equal(plain[k], hooked[k])
    with pytest.raises(ValueError, match="matches no tensor"):
        interpolate(
            a,
            b,
            tmp_path / "x",
            0.5,
            hooks=WeightHooks([{"fn": "renorm_rows", "match": ["nGPT_alpha"]}]),
        )
    assert not (tmp_path / "x").exists()
