"""Where a model stops: the tokens that end its answer, as the checkpoint itself says.

A model trained on a chat template ends its turn with the template's end-of-turn token
(``<|eot_id|>`` for Llama 3, ``<end_of_turn>`` for Gemma, ``<|im_end|>`` for ChatML), which need not
be the tokenizer's eos (``<|end_of_text|>``, ``<eos>``); ``generation_config.json`` lists the ids
its authors stop at. Stopping at only one of them lets an answer run on past its end to the token
cap: longer answers, more cap hits, skewed token ratios. The stop set is the union of all three,
used by every backend (in process and served) and recorded in the samples' provenance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..io import DataError

# the assistant reply rendered to find what the template writes after it (text no template
# writes of its own)
MARK = "stillroom-probe-reply"


@dataclass(frozen=True)
class StopSet:
    ids: tuple[int, ...]
    strings: tuple[str, ...]  # each id's text, for servers that stop on strings
    sources: dict[str, Any] = field(default_factory=dict)  # which id came from where

    def dump(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "strings": list(self.strings), "sources": self.sources}


def _generation_eos(ref: str) -> list[int]:
    """``eos_token_id`` of the checkpoint's generation_config.json (an int or a list), or none when
    it has no such file."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(ref)
    except OSError:
        return []
    eos = config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def control_token(tok, token_id: int) -> bool:
    """Whether ``token_id`` is a special token of ``tok`` (its eos, ``<|im_end|>``, ``<|eot_id|>``),
    never ordinary text: only such a token may end a turn or stop generation, since a model
    stopped at a text token (``y``, or an added non-special one like Qwen's ``<think>``) stops at
    every one it writes."""
    added = tok.added_tokens_decoder.get(token_id)
    return bool(added is not None and added.special) or token_id in tok.all_special_ids


def end_of_turn(tok) -> int | None:
    """The token the chat template writes right after an assistant reply's content (a one-turn
    conversation rendered), when it is a control token; None when the tokenizer has no template or
    the template ends a turn with text."""
    if not tok.chat_template:
        return None
    probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": MARK}]
    text = tok.apply_chat_template(probe, tokenize=False)
    at = text.rfind(MARK)
    ids = tok.encode(text[at + len(MARK) :].lstrip(), add_special_tokens=False) if at >= 0 else []
    return ids[0] if ids and control_token(tok, ids[0]) else None


def stop_set(ref: str, tok=None) -> StopSet:
    """The stop set of the model at ``ref`` (a checkpoint directory or hub id) whose tokenizer is
    ``tok`` (loaded from ``ref`` when not given): its generation_config eos ids, the chat template's
    end-of-turn token and the tokenizer's eos, in that order, each once."""
    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(ref)
    sources = {
        "generation_config": _generation_eos(ref),
        "chat_template": end_of_turn(tok),
        "tokenizer_eos": tok.eos_token_id,
    }
    ids: list[int] = []
    for found in sources.values():
        for i in found if isinstance(found, list) else [found]:
            if i is not None and i not in ids:
                ids.append(i)
    if not ids:
        raise DataError(
            f"{ref}: no stop token: generation_config.json has no eos_token_id, the chat template "
            "no end-of-turn token and the tokenizer no eos token, so every answer would run to "
            "the token cap"
        )
    unknown = [i for i in ids if not 0 <= i < len(tok)]
    if unknown:
        raise DataError(
            f"{ref}: stop ids {unknown} ({sources}) are outside the tokenizer's {len(tok)} tokens"
        )
    strings = tuple(tok.decode([i], skip_special_tokens=False) for i in ids)
    return StopSet(tuple(ids), strings, sources)
