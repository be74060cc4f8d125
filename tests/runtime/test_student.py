import random

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from stillroom.config import ConfigError
from stillroom.runtime.student import build_model, train_tokenizer

from ..conftest import MOE

MODEL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "<think>3 + 4 = 7.</think>\nThe answer is \\boxed{7}."},
    {"role": "user", "content": "And 12 * 3?"},
    {"role": "assistant", "content": "<think>12 * 3 = 36.</think>\nThe answer is \\boxed{36}."},
]


def corpus(n=300, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        yield f"What is {a} + {b}?"
        yield f"<think>{a} + {b} = {a + b}.</think>\nThe answer is \\boxed{{{a + b}}}."


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "tokenizer"
    train_tokenizer(corpus(), out, vocab_size=400, min_frequency=2)
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return AutoTokenizer.from_pretrained(tok_dir)


def test_tokenizer_is_deterministic(tok_dir, tmp_path):
    train_tokenizer(corpus(), tmp_path / "again", vocab_size=400, min_frequency=2)
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == (
        tok_dir / "tokenizer.json"
    ).read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


@pytest.mark.parametrize(
    "text",
    [
        "What is 1234 + 5678?",
        "<think>7 * 6 = 42, so x = 42.</think>\nThe answer is \\boxed{42}.",
        "\\frac{1}{2} + \\sqrt{x^2} \u2248 \u03c0 (unseen characters fall back to bytes)",
        "  leading spaces,\ttabs\n\nand blank lines  ",
    ],
)
def test_encode_decode_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == text  # <think> is not special: it survives


def test_line_merges_make_repeated_code_short(tmp_path):
    """pretokenize: lines lets a merge run along a line: a kernel seen in the corpus is a token or
    so a line, where GPT-2's word split leaves it hundreds; text round-trips either way."""
    from stillroom.kernels.family import problem_names, solution_source

    code = [solution_source(n) for n in problem_names("elementwise")]
    sizes = {}
    for mode in ("words", "lines"):
        train_tokenizer(code, tmp_path / mode, vocab_size=2048, min_frequency=2, pretokenize=mode)
        t = AutoTokenizer.from_pretrained(tmp_path / mode)
        ids = t.encode(code[0], add_special_tokens=False)
        assert t.decode(ids) == code[0]
        unseen = "def f(a, b):\n    return a ** b  # π\n"
        assert t.decode(t.encode(unseen, add_special_tokens=False)) == unseen
        assert t.convert_tokens_to_ids("<think>") != t.unk_token_id
        sizes[mode] = len(ids)
    assert sizes["lines"] <= code[0].count("\n") + 2 < 100 < sizes["words"], sizes
    with pytest.raises(ValueError, match="pretokenize: 'chars' is neither"):
        train_tokenizer(
            code, tmp_path / "chars", vocab_size=400, min_frequency=2, pretokenize="chars"
        )


def test_think_tags_are_single_tokens(tok):
    for tag in ("<think>", "</think>"):
        assert tok.tokenize(tag) == [tag]
    ids = tok.encode("<think>x</think>", add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<think>") and ids[-1] == tok.convert_tokens_to_ids(
        "</think>"
    )
    assert (
        tok.eos_token == "<|im_end|>"
        and tok.pad_token == "<|pad|>"
        and tok.bos_token == "<|endoftext|>"
    )


def test_chat_template_renders_chatml(tok):
    text = tok.apply_chat_template(MESSAGES[:3], tokenize=False)
    assert text == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n"
        "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n"
        "<|im_start|>assistant\n<think>3 + 4 = 7.</think>\nThe answer is \\boxed{7}.<|im_end|>\n"
    )
    prompt = tok.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == text[: text.index("<think>")]
    assert not tok.apply_chat_template(MESSAGES[:2], tokenize=False).endswith("assistant\n")


def test_assistant_mask_covers_exactly_assistant_turns(tok):
    enc = tok.apply_chat_template(
        MESSAGES, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    assert len(ids) == len(mask)
    spans, current = [], []
    for token, bit in zip(ids, mask, strict=False):
        if bit:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    spans += [current] if current else []
    expected = [m["content"] + "<|im_end|>" for m in MESSAGES if m["role"] == "assistant"]
    assert [tok.decode(s) for s in spans] == expected
    unmasked = tok.decode([t for t, bit in zip(ids, mask, strict=False) if not bit])
    assert (
        "Answer briefly." in unmasked and "What is 3 + 4?" in unmasked and "<think>" not in unmasked
    )


def test_build_model_is_loadable(tok_dir, tmp_path):
    out = tmp_path / "base"
    metrics = build_model(tok_dir, out, model=MODEL, seed=0)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert metrics == {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": model.config.vocab_size,
    }
    assert model.config.vocab_size >= len(tok) and model.config.vocab_size % 8 == 0
    assert model.config.eos_token_id == tok.eos_token_id == im_end
    assert model.generation_config.eos_token_id == im_end
    assert model.generation_config.pad_token_id == tok.pad_token_id
    prompt = tok.apply_chat_template(
        MESSAGES[:2], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out_ids = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out_ids.shape[1] <= prompt["input_ids"].shape[1] + 4


def test_seed_controls_weights(tok_dir, tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        build_model(tok_dir, tmp_path / name, model=MODEL, seed=seed)
    a, b, c = (load_file(tmp_path / n / "model.safetensors") for n in "abc")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda m: m.update(hidden_sise=32), "student.model: unknown key 'hidden_sise'"),
        (lambda m: m.pop("head_dim"), "student.model.head_dim: required key missing"),
    ],
)
def test_bad_model_keys_raise(tok_dir, tmp_path, change, match):
    model = dict(MODEL)
    change(model)
    with pytest.raises(ConfigError, match=match):
        build_model(tok_dir, tmp_path / "bad", model=model, seed=0)
    assert not (tmp_path / "bad").exists()


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
    with pytest.raises(ConfigError, match="student.model.family: qwen3_moe needs num_experts"):
        build_model(
            root / "tok",
            root / "x",
            model={k: v for k, v in MOE.items() if k != "num_experts"},
            seed=0,
        )
