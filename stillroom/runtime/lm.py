"""Batched sampling from a local transformers model: evaluation of every model, and the ``hf``
teacher."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .stops import StopSet, stop_set


@dataclass
class Sample:
    text: str
    finish_reason: str  # "stop" when a token of the model's stop set came, else "length"
    prompt_tokens: int
    completion_tokens: int
    # the completion, for exact continuation
    token_ids: list[int] = field(default_factory=list, repr=False)


class ChatTokens:
    """Prompt rendering and token round trips with the checkpoint's own tokenizer (``self.tok``),
    shared by the in-process and the served model, so both build exactly the same prompts."""

    tok: Any
    stops: StopSet  # where the model's answers end (stops.py)

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        return self.tok.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)


class LocalLM(ChatTokens):
    def __init__(self, path: str, threads: int = 1):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(max(1, threads))
        self.tok = AutoTokenizer.from_pretrained(path)
        self.tok.padding_side = "left"
        # The job's GPU when there is one (the hf backend's job asks for one), in the checkpoint's
        # own dtype; on CPU float32, where bf16 matmuls are slow and inexact.
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu"
        self.model = (
            AutoModelForCausalLM.from_pretrained(path, dtype="auto" if cuda else torch.float32)
            .to(self.device)
            .eval()
        )
        # MoE training turns router logits on for the auxiliary loss; sampling needs none of it, and
        # with padded batches transformers' load-balancing loss fails on mismatched shapes.
        if getattr(self.model.config, "output_router_logits", False):
            self.model.config.output_router_logits = False
        self.stops = stop_set(path, self.tok)
        self.name = path

    def sample(
        self,
        prompts: Sequence[str],
        *,
        k: int = 1,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[Sample]]:
        """k samples for each rendered prompt, in one generate call (seeded, so reproducible)."""
        flat = self.complete(
            [self.encode(p) for p in prompts for _ in range(k)],
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            seed=seed,
        )
        return [flat[i * k : (i + 1) * k] for i in range(len(prompts))]

    def complete(
        self,
        prefixes: Sequence[Sequence[int]],
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        seed: int,
    ) -> list[Sample]:
        """Continue each token prefix (a rendered prompt, maybe with part of an answer) by up to
        ``max_new_tokens``: raw completion, so a cut-off answer resumes from its exact tokens."""
        import torch

        width = max(len(p) for p in prefixes)
        stops = list(self.stops.ids)
        # Llama 3 has no pad token: a stop id pads (masked out, and cut off the answers below)
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else stops[0]
        # left padding
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prefixes])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prefixes])
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                do_sample=temperature > 0,
                temperature=temperature or None,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                eos_token_id=stops,
                pad_token_id=pad,
            )
        results = []
        for prefix, seq in zip(prefixes, out[:, width:].tolist(), strict=True):
            end = next((i for i, t in enumerate(seq) if t in stops), None)
            stopped = end is not None
            new = seq[: end + 1] if stopped else [t for t in seq if t != pad]
            results.append(
                Sample(
                    self.decode(new), "stop" if stopped else "length", len(prefix), len(new), new
                )
            )
        return results
