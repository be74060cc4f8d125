"""CPU SFT throughput of the tiny students, as a regression baseline: dense Qwen3 full fine-tune,
Qwen3-MoE full fine-tune and Qwen3-MoE LoRA, each a fixed number of steps through
stillroom.runtime.sft.train_sft.

Builds everything in a temporary directory: a synthetic SFT set of generated arithmetic problems
with worked solutions (stillroom.data.sources), one byte-level BPE tokenizer trained on it, and a
randomly initialised student per family (shapes from config/config.yaml and
config/experiments/beam-tiny-smoke.yaml, LoRA settings from the latter). tokens/s is train_sft's
own metric (non-padding input tokens over the wall time of trainer.train, first step included);
packing is real tokens over packed token slots. Prints numbers only.

    .venv/bin/python bench/train_throughput.py [--steps 30] [--batch-size 8] [--max-length 256]
        [--threads 2]
"""

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stillroom.data.sources import generate, worked_solution
from stillroom.runtime.sft import train_sft
from stillroom.runtime.student import build_model, train_tokenizer

DENSE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
MOE = {
    "family": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 64,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
LORA = {
    "r": 8,
    "alpha": 16,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
}


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all processes, all cores)."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:9]]
    # less idle and iowait
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def sft_rows(count: int, seed: int) -> list[dict]:
    """Arithmetic problems answered with a worked solution of varying detail (so lengths vary)."""
    rows = []
    for i, rec in enumerate(generate("arithmetic", "bench", count, seed, max_operand=99)):
        reasoning, final = worked_solution(rec["meta"], rec["answer"], detail=i % 4)
        rows.append(
            {
                "id": rec["prompt_id"],
                "messages": [
                    {"role": "user", "content": rec["prompt"]},
                    {"role": "assistant", "content": f"{reasoning}\n{final}"},
                ],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--vocab-size", type=int, default=1024)
    args = ap.parse_args()

    # Progress bars and deprecation warnings from datasets / transformers would bury the table.
    from datasets.utils.logging import disable_progress_bar as quiet_datasets
    from transformers.utils import logging as hf_logging

    quiet_datasets()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)

    runs = [
        ("dense full", DENSE, {}),
        ("moe full", MOE, {}),
        ("moe lora", MOE, {"method": "lora", "lora": LORA}),
    ]
    with tempfile.TemporaryDirectory(prefix="train_throughput_") as tmp:
        tmp = Path(tmp)
        rows = sft_rows(args.examples, seed=0)
        dataset = tmp / "sft.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        train_tokenizer(
            [m["content"] for r in rows for m in r["messages"]],
            tmp / "tokenizer",
            vocab_size=args.vocab_size,
            min_frequency=2,
        )
        for family, model in (("qwen3", DENSE), ("qwen3_moe", MOE)):
            build_model(tmp / "tokenizer", tmp / family, model=model, seed=0)

        print(
            f"{len(rows)} examples, vocab {args.vocab_size}, {args.steps} steps of batch "
            f"{args.batch_size} x max_length {args.max_length}, {args.threads} threads"
        )
        print(
            "others: share of the machine's CPU used by other processes during the run "
            "(skews times)"
        )
        print(
            f"{'run':<12}{'params':>9}{'trainable':>11}{'steps':>7}{'seconds':>9}{'s/step':>8}"
            f"{'tokens/s':>10}{'packing':>9}{'wall':>7}{'others':>8}"
        )
        for name, model, extra in runs:
            params = {
                "max_steps": args.steps,
                "batch_size": args.batch_size,
                "max_length": args.max_length,
                "logging_steps": args.steps,
                **extra,
            }
            base = tmp / model.get("family", "qwen3")
            t0, busy0, own0 = time.perf_counter(), busy_cpu_seconds(), sum(os.times()[:2])
            m = train_sft(
                base,
                dataset,
                tmp / name.replace(" ", "_"),
                params=params,
                seed=0,
                threads=args.threads,
                log=lambda _: None,
            )
            # the whole call: tokenization, packing, model load and save too
            wall = time.perf_counter() - t0
            others = (busy_cpu_seconds() - busy0 - (sum(os.times()[:2]) - own0)) / (
                wall * os.cpu_count()
            )
            print(
                f"{name:<12}{m['parameters_total']:>9,}{m['trainable_total']:>11,}{m['steps']:>7}"
                f"{m['train_seconds']:>9.2f}{m['train_seconds'] / m['steps']:>8.3f}"
                f"{m['tokens_per_second']:>10.0f}{m['packing_efficiency']:>9.4f}{wall:>7.1f}"
                f"{others:>8.0%}"
            )


if __name__ == "__main__":
    main()
