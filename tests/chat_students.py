"""Tiny students with real models' chat conventions, built locally: a Llama-3-Instruct-style one
(eos ``<|end_of_text|>``, turns ended by ``<|eot_id|>``, generation_config listing both and
``<|eom_id|>``, no pad token) and a Gemma-style one (eos ``<eos>``, turns ended by
``<end_of_turn>``, generation_config listing only ``<eos>``, as an int)."""

from pathlib import Path

from stillroom.runtime.student import THINK_TOKENS

from .conftest import TINY

# Newlines are emitted as {{ '\n' }} after block tags (transformers renders with trim_blocks=True).
STYLES = {
    "llama3": {
        "specials": [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eom_id|>",
            "<|eot_id|>",
        ],
        "bos": "<|begin_of_text|>",
        "eos": "<|end_of_text|>",
        "pad": None,
        "generation_eos": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
        "template": (
            "{{ bos_token }}{% for message in messages %}"
            "<|start_header_id|>{{ message['role'] }}<|end_header_id|>{{ '\\n\\n' }}"
            "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
            "{% if add_generation_prompt %}"
            "<|start_header_id|>assistant<|end_header_id|>{{ '\\n\\n' }}{% endif %}"
        ),
        "family": "llama",
    },
    "gemma": {
        "specials": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        "bos": "<bos>",
        "eos": "<eos>",
        "pad": "<pad>",
        "generation_eos": "<eos>",
        "template": (
            "{{ bos_token }}{% for message in messages %}"
            "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
            "<start_of_turn>{{ role }}{{ '\\n' }}{{ message['content'] | trim }}"
            "<end_of_turn>{{ '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}<start_of_turn>model{{ '\\n' }}{% endif %}"
        ),
        "family": "gemma",
    },
}


def build(root: Path, style: str, seed: int = 0) -> Path:
    """A random-weight student of ``style`` (STYLES) saved under ``root / style``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        AddedToken,
        AutoModelForCausalLM,
        GemmaConfig,
        GenerationConfig,
        LlamaConfig,
        PreTrainedTokenizerFast,
    )

    s = STYLES[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=s["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [
        f"<think>{a} + {b} = {a + b}.</think> The answer is {a + b}."
        for a in range(20)
        for b in range(20)
    ]
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=s["bos"],
        eos_token=s["eos"],
        pad_token=s["pad"],
        chat_template=s["template"],
    )
    hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    ids = hf.convert_tokens_to_ids
    shape = dict(
        TINY,
        vocab_size=len(hf),
        bos_token_id=ids(s["bos"]),
        eos_token_id=ids(s["eos"]),
        pad_token_id=ids(s["pad"]) if s["pad"] else None,
    )
    config = (LlamaConfig if s["family"] == "llama" else GemmaConfig)(**shape)
    torch.manual_seed(seed)
    net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    eos = s["generation_eos"]
    net.generation_config = GenerationConfig(
        bos_token_id=shape["bos_token_id"],
        eos_token_id=ids(eos) if isinstance(eos, str) else [ids(t) for t in eos],
        do_sample=True,
    )
    out = root / style
    net.save_pretrained(out)
    hf.save_pretrained(out)
    return out
