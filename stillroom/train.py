"""SFT of the student on teacher traces (full, LoRA or QLoRA), with TRL's SFTTrainer and BFD packing.

Packed documents are kept apart by restarting position_ids: transformers derives a block-diagonal
causal mask from them only when there is no attention_mask and no KV cache, hence use_cache=False.
With sdpa, packed rows are batched as (batch, max_length): sdpa materialises a dense mask, so one
long row would cost batch times more attention (2-4x slower steps on CPU). FlashAttention is the
opposite: it finds documents from position_ids only in a single row (varlen), and would let the
documents of a multi-row batch attend to each other, so for it the rows are flattened padding-free.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stillroom import launch
from stillroom.adapters import (
    check_lora,
    disable_cpu_repacking,
    lora_config,
    quantization_config,
    resolve_targets,
    trainable_breakdown,
)
from stillroom.conversations import check_renders, load_conversations
from stillroom.hooks import WeightHooks, check_options, step_callback
from stillroom.io import DataError, atomic_dir, write_json
from stillroom.launch import check_distributed
from stillroom.provenance import digest
from stillroom.sharded_checkpoints import sharded_checkpoints

PARAM_DEFAULTS: dict[str, Any] = {
    "lr": 1e-3,
    "epochs": 1.0,
    "max_steps": -1,
    "batch_size": 8,
    "grad_accum": 1,
    "max_length": 1024,
    "warmup_ratio": 0.0,
    "lr_scheduler": "cosine",
    "weight_decay": 0.0,
    "seed": 0,
    "logging_steps": 10,
    "method": "full",
    "lora": None,
    "load_in_4bit": False,
    "save_steps": 0,
    "dtype": "auto",
    "attn_implementation": "sdpa",
    "gradient_checkpointing": False,
    "distributed": None,
    "device_map": None,
    "gpu_memory_limit": None,
    "max_memory": None,
    "weight_hooks": [],
    "sampled_options": {},
}
DTYPES = ("auto", "float32", "bfloat16")


def check_params(params: Mapping) -> dict[str, Any]:
    """Return ``params`` over the defaults; unknown keys, out-of-range values and inconsistent
    combinations raise ValueError naming the key. Nothing is loaded: these fail in a second."""
    unknown = sorted(set(params) - set(PARAM_DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown training param(s): {', '.join(unknown)} (known: {', '.join(PARAM_DEFAULTS)})"
        )
    p = {**PARAM_DEFAULTS, **params}
    lowest = {
        "batch_size": 1,
        "grad_accum": 1,
        "max_length": 1,
        "logging_steps": 1,
        "max_steps": -1,
        "seed": 0,
        "save_steps": 0,
    }
    for key, low in lowest.items():
        if isinstance(p[key], bool) or not isinstance(p[key], int) or p[key] < low:
            raise ValueError(f"training param {key} must be an int >= {low}, got {p[key]!r}")
    if not 0 <= p["warmup_ratio"] < 1:
        raise ValueError(
            f"training param warmup_ratio must be in [0, 1), got {p['warmup_ratio']!r}"
        )
    if p["dtype"] not in DTYPES:
        raise ValueError(f"train.dtype: {p['dtype']!r} is not one of {', '.join(DTYPES)}")
    if p["dtype"] == "bfloat16" and p["method"] == "full":
        raise ValueError(
            "train.dtype bfloat16 with method full trains bf16 weights without a float32 master copy: "
            "updates below half a bf16 step (most, at lr 1e-5) are lost. Use dtype auto "
            "(float32 weights, bf16 compute on GPU)"
        )
    p["lora"] = check_lora(p)
    p["distributed"] = check_distributed(p)
    if p["weight_hooks"] and p["method"] != "full":
        raise ValueError(
            "student.weight_hooks re-normalise trained weights after each step; with an adapter "
            f"(train.method {p['method']}) the base is frozen and they have nothing to act on"
        )
    WeightHooks(p["weight_hooks"])
    p["sampled_options"] = check_options(p["sampled_options"])
    return p


def supervision_stats(
    tokenizer, examples: list[dict], max_length: int, source: str = "dataset"
) -> dict[str, int]:
    """Count tokens after truncation at max_length; fail if any example keeps no assistant token."""
    total = supervised = truncated = 0
    empty = []
    for ex in examples:
        enc = tokenizer.apply_chat_template(
            ex["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        mask = enc["assistant_masks"][:max_length]
        truncated += len(enc["input_ids"]) > max_length
        total += len(mask)
        supervised += sum(mask)
        if not any(mask):
            empty.append(ex["id"])
    if empty:
        raise DataError(
            f"{source}: {len(empty)} of {len(examples)} examples have no assistant tokens left after truncation "
            f"at max_length={max_length} (ids: {', '.join(empty[:10])}{' ...' if len(empty) > 10 else ''})"
        )
    return {
        "examples": len(examples),
        "supervised_tokens": supervised,
        "total_tokens": total,
        "truncated": truncated,
    }


def progress_callback(log: Callable[[str], Any]):
    """A TrainerCallback sending one line per logging step to ``log``."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                log(
                    f"step {state.global_step}/{state.max_steps} loss {logs['loss']:.4f} "
                    f"lr {logs.get('learning_rate', 0.0):.2e} {time.perf_counter() - self.start:.1f} s"
                )

    return Progress()


def collate_packed_rows(examples: list[dict], *, pad_token_id: int, flatten: bool = False) -> dict:
    """Stack packed rows (input_ids, labels, seq_lengths) into right-padded tensors with restarting positions;
    ``flatten`` concatenates them into one unpadded row instead (FlashAttention varlen)."""
    import torch

    if flatten:
        examples = [
            {
                key: [x for ex in examples for x in ex[key]]
                for key in ("input_ids", "labels", "seq_lengths")
            }
        ]

    shape = (len(examples), max(len(ex["input_ids"]) for ex in examples))
    ids, labels = torch.full(shape, pad_token_id), torch.full(shape, -100)
    positions = torch.zeros(shape, dtype=torch.long)
    for row, ex in enumerate(examples):
        n = len(ex["input_ids"])
        ids[row, :n] = torch.tensor(ex["input_ids"])
        labels[row, :n] = torch.tensor(ex["labels"])
        positions[row, :n] = torch.cat([torch.arange(k) for k in ex["seq_lengths"]])
    labels[
        positions == 0
    ] = -100  # a document's first token is never predicted from the one before it
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def _dtype(params: Mapping, cuda: bool):
    """Storage dtype of the loaded weights. Trained weights stay float32 (bf16 compute comes from autocast
    or FSDP2 mixed precision): a bf16 master copy loses every update below half a bf16 step, which at
    lr 1e-5 is nearly all of them. Only a frozen adapter base is stored in bf16 on GPU."""
    import torch

    name = (
        params["dtype"]
        if params["dtype"] != "auto"
        else ("bfloat16" if cuda and params["method"] != "full" else "float32")
    )
    return getattr(torch, name)


def load_model(base_dir, params: Mapping):
    """The model to train, placed and sharded as ``params`` say: full precision, NF4 for QLoRA, FSDP2
    shards across the processes of ``params["distributed"]``, or a device map across one process's GPUs."""
    import torch
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    dtype = _dtype(params, cuda)
    kwargs = launch.load_kwargs(params, params["distributed"])
    if params[
        "load_in_4bit"
    ]:  # a whole 4-bit replica on this process's device, unless a device map spreads it
        kwargs["quantization_config"] = quantization_config(dtype)
        kwargs.setdefault(
            "device_map", {"": int(os.environ.get("LOCAL_RANK", "0"))} if cuda else "cpu"
        )
    model = AutoModelForCausalLM.from_pretrained(
        Path(base_dir), attn_implementation=params["attn_implementation"], dtype=dtype, **kwargs
    )
    model.config.use_cache = (
        False  # a cache disables the packed-document mask (see module docstring)
    )
    if params["load_in_4bit"] and not cuda:
        disable_cpu_repacking(model)
    return model


def build_trainer(
    base_dir,
    examples: list[dict],
    params: Mapping,
    output_dir,
    callbacks=(),
    resume: str | None = None,
):
    """The SFTTrainer for ``examples`` (validated ``params``), model loaded fresh from ``base_dir``."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    cuda = torch.cuda.is_available()
    sharded = launch.sharded(params, params["distributed"])
    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    model = load_model(base_dir, params)
    config = SFTConfig(
        output_dir=str(output_dir),
        learning_rate=params["lr"],
        num_train_epochs=params["epochs"],
        max_steps=params["max_steps"],
        per_device_train_batch_size=params["batch_size"],
        gradient_accumulation_steps=params["grad_accum"],
        warmup_steps=params["warmup_ratio"],  # a float < 1 is a ratio in transformers 5
        lr_scheduler_type=params["lr_scheduler"],
        weight_decay=params["weight_decay"],
        seed=params["seed"],
        data_seed=params["seed"],
        logging_steps=params["logging_steps"],
        logging_first_step=True,
        max_length=params["max_length"],
        packing=True,
        packing_strategy="bfd",
        assistant_only_loss=True,
        use_cpu=not cuda,
        bf16=cuda,  # bf16 autocast on GPU, whatever the storage dtype
        include_num_input_tokens_seen="non_padding",
        # Sharded runs checkpoint through their own callback (see sharded_checkpoints.py)
        save_strategy="steps" if params["save_steps"] and not sharded else "no",
        save_steps=params["save_steps"] or 500,
        save_total_limit=2,
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
        # TRL turns it on by default: needless recompute at student sizes, essential at 16k on a large model
        gradient_checkpointing=params["gradient_checkpointing"],
    )
    dataset = Dataset.from_list([{"messages": ex["messages"]} for ex in examples])
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=list(callbacks),
        peft_config=lora_config(params["lora"]) if params["lora"] else None,
    )
    # TRL refuses a custom collator with BFD packing (it assumes flash-attention varlen); swap it in after.
    trainer.data_collator = functools.partial(
        collate_packed_rows,
        pad_token_id=tokenizer.pad_token_id,
        flatten="flash" in params["attn_implementation"],
    )
    trainer.remove_callback(PrinterCallback)  # progress goes through our own log callable
    if sharded and params["save_steps"]:
        trainer.add_callback(sharded_checkpoints(Path(output_dir), params["save_steps"], resume))
        # The Trainer cannot load weights into a load-time-sharded model; the callback restores them.
        trainer._load_from_checkpoint = lambda *args, **kwargs: None
    return trainer


def _last_checkpoint(checkpoints: Path, fingerprint: Mapping, log, main: bool = True) -> str | None:
    """The newest complete checkpoint made with this fingerprint. Only the main rank deletes stale or
    incomplete ones (the others read the same directory and come to the same answer), so no rank can
    remove what another has just written."""
    if not checkpoints.is_dir():
        return None
    saved = checkpoints / "fingerprint.json"
    if not saved.exists() or json.loads(saved.read_text()) != json.loads(json.dumps(fingerprint)):
        if main:
            log(f"discarding checkpoints in {checkpoints}: made with other params or inputs")
            shutil.rmtree(checkpoints, ignore_errors=True)
        return None
    found = sorted(
        (p for p in checkpoints.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
        reverse=True,
    )
    for candidate in found:
        # A kill during a save leaves no trainer_state.json: it is written last (by transformers, and by
        # sharded_checkpoints after every rank's shards and RNG state are in).
        if (candidate / "trainer_state.json").exists():
            log(f"resuming from {candidate}")
            return str(candidate)
        if main:
            log(f"discarding incomplete {candidate}")
            shutil.rmtree(candidate, ignore_errors=True)
    return None


def _gather_adapter(model) -> dict:
    """The LoRA tensors of an FSDP2-sharded PEFT model, whole, on CPU; every rank must call it. Only the
    adapter crosses the network: gathering the base too would be the full model in one process."""
    from torch.distributed.tensor import DTensor

    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
        for name, p in model.named_parameters()
        if "lora_" in name
    }


def train_sft(
    base_dir, dataset_path, out_dir, *, params: Mapping, threads: int = 1, log=print
) -> dict:
    """Fine-tune the model in ``base_dir`` on ``dataset_path``; save it to ``out_dir``; return metrics.

    Inside a torchrun worker every rank runs this; rank 0 alone writes files and logs progress lines.
    """
    import torch
    from transformers import AutoTokenizer

    from stillroom.merge import merge_adapter
    from stillroom.student import generation_config

    p = check_params(params)
    if p["lora"]:
        resolve_targets(base_dir, p["lora"])
    main = launch.rank() == 0
    torch.set_num_threads(threads)
    examples = load_conversations(dataset_path)
    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    check_renders(tokenizer, examples, source=str(dataset_path))
    stats = supervision_stats(tokenizer, examples, p["max_length"], source=str(dataset_path))
    log(
        f"{stats['examples']} examples, {stats['supervised_tokens']} supervised of {stats['total_tokens']} tokens "
        f"({stats['truncated']} truncated at max_length {p['max_length']})"
    )
    # Checkpoints live beside the output (which appears only when training is done), so a job killed by
    # preemption or wall time resumes there; a fingerprint keeps a changed run from resuming a stale one.
    checkpoints = Path(str(out_dir).rstrip("/") + ".checkpoints")
    fingerprint, last = None, None
    if p["save_steps"]:
        fingerprint = {
            "params": p,
            "base": digest(base_dir)["sha256"],
            "dataset": digest(dataset_path)["sha256"],
        }
        last = _last_checkpoint(checkpoints, fingerprint, log, main)
    sampled: dict[str, dict] = {}
    callbacks = [progress_callback(log)] if main else []
    hooks = WeightHooks(p["weight_hooks"])
    if hooks or p["sampled_options"]:
        callbacks.append(step_callback(hooks, p["sampled_options"], p["seed"], sampled))
    # Every rank takes part in gathering the sharded weights for the save; only rank 0 keeps a directory.
    with atomic_dir(out_dir) if main else tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trainer = build_trainer(
            base_dir, examples, p, checkpoints, callbacks=callbacks, resume=last
        )
        breakdown = trainable_breakdown(trainer.model)
        log(
            f"trainable parameters {breakdown['trainable']} of {breakdown['parameters_total']:,} "
            f"({breakdown['adapter_bytes'] / 2**20:.2f} MiB)"
        )
        packed = trainer.train_dataset
        real = sum(len(ids) for ids in packed["input_ids"])
        start = time.perf_counter()
        if p["save_steps"] and main:
            checkpoints.mkdir(parents=True, exist_ok=True)
            write_json(checkpoints / "fingerprint.json", fingerprint)
        trainer.train(resume_from_checkpoint=last)
        seconds = time.perf_counter() - start
        model = trainer.accelerator.unwrap_model(trainer.model)
        state = None
        if launch.sharded(p, p["distributed"]):
            state = _gather_adapter(model) if p["lora"] else launch.gather_state(model)
        if main:
            if p["lora"]:
                # Keep the adapter, and give later stages the adapter merged into the full-precision base:
                # for QLoRA that is the original bf16/fp32 base, not the NF4 weights trained against.
                model.save_pretrained(tmp / "adapter", state_dict=state)
                model = merge_adapter(base_dir, tmp / "adapter")
            elif state is not None:
                model = launch.unsharded(model, state)
            model.config.use_cache = True  # inference downstream wants the cache back
            if not (Path(base_dir) / "generation_config.json").exists():
                model.generation_config = generation_config(tokenizer)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    if main:
        shutil.rmtree(checkpoints, ignore_errors=True)

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    metrics = {
        **{k: stats[k] for k in ("examples", "supervised_tokens", "total_tokens")},
        "steps": trainer.state.global_step,
        "losses": losses,
        "first_loss": losses[0] if losses else None,
        "final_loss": sum(losses[-3:]) / len(losses[-3:]) if losses else None,
        "train_seconds": round(seconds, 3),
        "tokens_per_second": round(trainer.state.num_input_tokens_seen / max(seconds, 1e-9), 1),
        "packing_efficiency": round(real / (len(packed) * p["max_length"]), 4),
        "world_size": p["distributed"]["world_size"],
        **({"sampled_options": sampled} if sampled else {}),
        **breakdown,
    }
    log(
        f"trained {metrics['steps']} steps in {seconds:.1f} s ({metrics['tokens_per_second']:.0f} tokens/s), "
        f"loss {metrics['first_loss']} -> {metrics['final_loss']}"
    )
    return metrics


def run(
    *, base: str, dataset: str, out_model: str, params: Mapping, threads: int = 1, log=print, **_
) -> dict:
    """The CLI's ``train`` stage: in this process, or on every process of ``train.distributed``."""
    layout = check_params(params)["distributed"]
    if layout["world_size"] == 1:
        return train_sft(base, dataset, out_model, params=params, threads=threads, log=log)
    per_process = max(1, threads // layout["gpus_per_node"])
    return launch.spawn(
        layout,
        {
            "base_dir": base,
            "dataset_path": dataset,
            "out_dir": out_model,
            "params": dict(params),
            "threads": per_process,
        },
        log,
        cpus=threads,
    )
