"""What every check shares: the sizes it runs at (a model worth timing on a GPU, a toy
one on CPU) and its verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Log = Callable[[str], Any]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Sizes:
    """How big each check runs: a model worth timing on a GPU, or a toy one on CPU."""

    model: dict[str, Any]
    vocab_size: int
    conversations: int
    max_turns: int  # conversations of 1..max_turns problems: lengths vary, so padding costs
    steps: int
    docs_per_step: int
    max_length: int  # tokens per packed row
    trainer_rows: int  # packed rows per step of the production trainer
    lr: float
    qlora_lr: float
    lora_r: int
    eval_problems: int
    eval_samples: int
    eval_new_tokens: int
    kernel_trials: int
    kernel_timeout_s: float
    kernel_workers: int
    # the flagship's Qwen3-MoE (all its layers sparse) and its optimizer steps
    moe_model: dict[str, Any]
    moe_steps: int
    kernel_problems: tuple[str, ...] | None = None  # None: all of the project's problems


SIZES = {
    "cuda": Sizes(
        model=dict(
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
        ),
        vocab_size=4096,
        conversations=1024,
        max_turns=8,
        steps=20,
        docs_per_step=32,
        max_length=2048,
        trainer_rows=4,
        lr=1e-3,
        qlora_lr=5e-3,
        lora_r=16,
        eval_problems=16,
        eval_samples=4,
        eval_new_tokens=128,
        kernel_trials=3,
        kernel_timeout_s=60.0,
        # Compiles are CPU-bound and the GPU work of each candidate is microseconds, so a few in
        # flight keep all 48 within the limit; speedups are timed with others compiling beside.
        kernel_workers=4,
        # ~40M parameters, 94% of them experts (the real model's share); every NF4 shape divides
        # the 8 ways of a full node
        moe_model=dict(
            family="qwen3_moe",
            hidden_size=512,
            intermediate_size=1536,
            moe_intermediate_size=384,
            num_experts=16,
            num_experts_per_tok=4,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
        moe_steps=8,
    ),
    "cpu": Sizes(
        model=dict(
            hidden_size=64,
            intermediate_size=192,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=512,
            tie_word_embeddings=True,
        ),
        vocab_size=320,
        conversations=48,
        max_turns=1,  # short documents, several to a row: a leak shows at this size
        steps=3,
        docs_per_step=8,
        max_length=512,
        trainer_rows=2,
        lr=1e-3,
        qlora_lr=5e-3,
        lora_r=4,
        eval_problems=3,
        eval_samples=2,
        eval_new_tokens=16,
        kernel_trials=1,
        kernel_timeout_s=60.0,
        kernel_workers=2,
        moe_model=dict(
            family="qwen3_moe",
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=512,
            tie_word_embeddings=False,
        ),
        moe_steps=4,
        kernel_problems=("add", "relu"),
    ),
}


def verdict(failures: list[str], **numbers: Any) -> dict[str, Any]:
    return {"status": "fail" if failures else "pass", "failures": failures, **numbers}


def decreased(losses: list[float]) -> bool:
    """The last three steps' mean below the first step's (train_sft's final_loss)."""
    tail = losses[-3:]
    return len(losses) > 1 and sum(tail) / len(tail) < losses[0]


def attention(device: str) -> str:
    from transformers.utils import is_flash_attn_2_available

    return "flash_attention_2" if device == "cuda" and is_flash_attn_2_available() else "sdpa"


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def mib(nbytes: float) -> float:
    return round(nbytes / 2**20, 2)
