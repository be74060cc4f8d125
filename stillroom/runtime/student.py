"""The student's builders: a byte-level BPE tokenizer trained on the corpus and a small randomly
initialised Qwen3 (or Qwen3-MoE), or a random-weight model shrunk from a real one for smoke tests.

A student built from scratch needs no model hub. The ChatML template marks assistant content plus
its ``<|im_end|>`` as ``{% generation %}`` so ``assistant_only_loss`` trains the model to stop.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..config import ModelShape
from ..io import atomic_dir
from .saving import save_pretrained

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
THINK_TOKENS = ["<think>", "</think>"]

# Newlines after block tags are emitted as {{ '\n' }}: transformers renders with trim_blocks=True,
# which would swallow a literal newline following a tag.
# Tool calls render Qwen-style inside the assistant's generation block (the model learns to emit
# them); tool results get their own "tool" turn naming the function, outside it (the model never
# writes them).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|im_start|>assistant\n{% generation %}{{ message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{{ '{\"name\": ' }}{{ call['function']['name'] | tojson }}"
    "{{ ', \"arguments\": ' }}{{ call['function']['arguments'] | tojson }}{{ '}' }}"
    "\n</tool_call>"
    "{% endfor %}"
    "<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "<|im_start|>tool\n<tool_response name={{ message['name'] | tojson }}>\n"
    "{{ message['content'] }}"
    "\n</tool_response><|im_end|>{{ '\\n' }}"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>{{ '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(
    texts: Iterable[str],
    out_dir: str | os.PathLike,
    *,
    vocab_size: int,
    min_frequency: int,
    model_max_length: int = 2048,
    pretokenize: str = "words",
):
    """Train a byte-level BPE on ``texts`` and save it (with the chat template) to ``out_dir``.

    ``pretokenize`` "words" splits as GPT-2 does (words, numbers, runs of punctuation), so no token
    crosses a word; "lines" lets merges run along a whole line (newline included), so a line of
    code repeated across the corpus becomes one token and a kernel a few dozen.
    """
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import AddedToken, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if pretokenize == "lines":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(r"[^\n]*\n|[^\n]+"), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pretokenize == "words":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        raise ValueError(f"pretokenize: '{pretokenize}' is neither 'words' nor 'lines'")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
    )
    # Plain added tokens, not special: the reasoning markers must survive
    # decode(skip_special_tokens=True).
    hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    with atomic_dir(out_dir) as tmp:
        save_pretrained(hf, tmp)
    return hf


def model_config(tokenizer, shape: ModelShape):
    """The transformers config of a student of ``shape`` for ``tokenizer``."""
    return shape_config(
        shape,
        # a multiple of 8 keeps the embedding matmuls aligned
        vocab_size=-(-len(tokenizer) // 8) * 8,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def shape_config(shape: ModelShape, **tokens: Any):
    """The transformers config of a student of ``shape``; ``tokens``: its vocabulary's size and
    special ids (without them, the shape alone: module names and attributes, before any job)."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    given = {k: v for k, v in shape.dump().items() if v is not None}
    family, rope_theta = given.pop("family"), given.pop("rope_theta", None)
    if rope_theta is not None:
        given["rope_parameters"] = {"rope_type": "default", "rope_theta": float(rope_theta)}
    config_class = Qwen3MoeConfig if family == "qwen3_moe" else Qwen3Config
    return config_class(dtype="float32", **tokens, **given)


def generation_config(tokenizer):
    """Defaults saved beside every student checkpoint; samplers downstream override them."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
    )


def build_model(
    tokenizer_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    model: ModelShape | Mapping,
    seed: int,
) -> dict:
    """Randomly initialise a Qwen3 student for the tokenizer in ``tokenizer_dir``; save both to
    ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(tokenizer_dir))
    config = model_config(tokenizer, ModelShape.parse(model, where="student.model"))
    torch.manual_seed(seed)
    net = AutoModelForCausalLM.from_config(config)
    net.generation_config = generation_config(tokenizer)
    with atomic_dir(out_dir) as tmp:
        save_pretrained(net, tmp)
        save_pretrained(tokenizer, tmp)
    return {"parameters": sum(p.numel() for p in net.parameters()), "vocab_size": config.vocab_size}


SHRINK_DEFAULTS = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 8,
}


def build_tiny_like(
    reference: str, out_dir: str | os.PathLike, *, shrink: Mapping | None = None, seed: int = 0
) -> dict:
    """A random-weight model of the same architecture as ``reference`` (a model directory or hub id:
    only its config and tokenizer are read), shrunk to smoke-test size, saved with the reference's
    tokenizer. Sizes are SHRINK_DEFAULTS (those the config has) updated by ``shrink``, whose keys
    the config must have; every other setting keeps the reference's value (top-k routing, norms,
    rope, layer types), so the smoke model runs the real code paths: fused experts, the router, the
    chat template."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(reference)
    text = config.get_text_config()
    sizes = {**{k: v for k, v in SHRINK_DEFAULTS.items() if hasattr(text, k)}, **(shrink or {})}
    unknown = sorted(k for k in sizes if not hasattr(text, k))
    if unknown:
        raise ValueError(f"shrink: {reference} config has no {', '.join(unknown)}")
    for key, value in sizes.items():
        setattr(text, key, value)
    if getattr(text, "num_experts_per_tok", 0) > sizes.get("num_experts", float("inf")):
        text.num_experts_per_tok = sizes["num_experts"]
    # per-layer attention kinds follow the depth
    if isinstance(getattr(text, "layer_types", None), list):
        text.layer_types = text.layer_types[: text.num_hidden_layers]
    tokenizer = AutoTokenizer.from_pretrained(reference)
    torch.manual_seed(seed)
    net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with atomic_dir(out_dir) as tmp:
        save_pretrained(net, tmp)
        save_pretrained(tokenizer, tmp)
    return {
        "parameters": sum(p.numel() for p in net.parameters()),
        "model_type": config.model_type,
        "shrunk": sizes,
    }
