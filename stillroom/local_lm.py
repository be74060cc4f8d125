"""Batched sampling from a local transformers model: evaluation of every model, and the ``hf`` teacher."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Sample:
    text: str
    finish_reason: str      # "stop" when the end-of-turn token came, else "length"
    prompt_tokens: int
    completion_tokens: int


class LocalLM:
    def __init__(self, path: str, threads: int = 1):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(max(1, threads))
        self.tok = AutoTokenizer.from_pretrained(path)
        self.tok.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        # MoE training turns router logits on for the auxiliary loss; sampling needs none of it, and with
        # padded batches transformers' load-balancing loss fails on mismatched shapes.
        if getattr(self.model.config, "output_router_logits", False):
            self.model.config.output_router_logits = False
        self.eos = self.tok.convert_tokens_to_ids("<|im_end|>")
        if self.eos is None or self.eos == self.tok.unk_token_id:
            self.eos = self.tok.eos_token_id
        self.name = path

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        return self.tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)

    def sample(self, prompts: Sequence[str], *, k: int = 1, temperature: float, top_p: float = 1.0,
               max_new_tokens: int, seed: int) -> list[list[Sample]]:
        """k samples for each rendered prompt, in one generate call (seeded, so reproducible)."""
        import torch

        enc = self.tok(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(**enc, do_sample=temperature > 0, temperature=temperature or None,
                                      top_p=top_p, max_new_tokens=max_new_tokens, num_return_sequences=k,
                                      eos_token_id=self.eos, pad_token_id=self.tok.pad_token_id)
        new = out[:, enc["input_ids"].shape[1]:]
        results: list[list[Sample]] = [[] for _ in prompts]
        for j, seq in enumerate(new.tolist()):
            stopped = self.eos in seq
            ids = seq[: seq.index(self.eos) + 1] if stopped else [t for t in seq if t != self.tok.pad_token_id]
            results[j // k].append(Sample(self.tok.decode(ids, skip_special_tokens=True),
                                          "stop" if stopped else "length", prompt_lens[j // k], len(ids)))
        return results
