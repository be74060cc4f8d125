"""The SFT trainer: TRL's SFTTrainer with BFD packing, full, LoRA or QLoRA, placed and sharded as
the train config says.

Packed documents are kept apart by restarting position_ids: transformers derives a block-diagonal
causal mask from them only when there is no attention_mask and no KV cache, hence use_cache=False.
With sdpa, packed rows are batched as (batch, max_length): sdpa materialises a dense mask, so one
long row would cost batch times more attention (2-4x slower steps on CPU). FlashAttention is the
opposite: it finds documents from position_ids only in a single row (varlen), and would let the
documents of a multi-row batch attend to each other, so for it the rows are flattened padding-free.

``train_sft`` is the training body the train stage (stages/train.py) launches: in its own process,
or on every process of ``train.distributed`` as ``python -m stillroom.runtime.sft`` workers
(launch.py); a killed job resumes from its last checkpoint beside the output.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import ConfigError, Student, Train, WeightHook
from ..config.training import OPTIMIZERS, EffortTagIn, TrainPhase
from ..data.conversations import check_renders, load_conversations
from ..grading.formats import with_effort_tag
from ..io import DataError, atomic_dir, write_json
from ..provenance.sidecars import digest
from . import launch
from .adapters import (
    check_saved_adapter,
    disable_cpu_repacking,
    gather_adapter,
    lora_config,
    meta_model,
    quantization_config,
    resolve_targets,
    trainable_breakdown,
)
from .checkpoints import (
    SaveClock,
    last_checkpoint,
    save_adapter_for_inference,
    save_for_inference,
    sharded_checkpoints,
    timed_saves,
)
from .templates import TrainingTemplate, check_supervision, check_system_turn, training_template


def encode_examples(tokenizer, template: TrainingTemplate, examples: list[dict]) -> list[dict]:
    """Each example's ``input_ids`` and ``assistant_masks`` under the training template."""
    return [template.encode(tokenizer, ex["messages"]) for ex in examples]


def supervision_stats(
    encoded: list[dict], ids: list[str], max_length: int, source: str = "dataset"
) -> dict[str, int]:
    """Count tokens after truncation at max_length; fail if any example keeps no assistant token."""
    total = supervised = truncated = 0
    empty = []
    for enc, id_ in zip(encoded, ids, strict=True):
        mask = enc["assistant_masks"][:max_length]
        truncated += len(enc["input_ids"]) > max_length
        total += len(mask)
        supervised += sum(mask)
        if not any(mask):
            empty.append(id_)
    if empty:
        raise DataError(
            f"{source}: {len(empty)} of {len(encoded)} examples have no assistant tokens left "
            f"after truncation at max_length={max_length} "
            f"(ids: {', '.join(empty[:10])}{' ...' if len(empty) > 10 else ''})"
        )
    return {
        "examples": len(encoded),
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
                    f"lr {logs.get('learning_rate', 0.0):.2e} "
                    f"{time.perf_counter() - self.start:.1f} s"
                )

    return Progress()


def collate_packed_rows(examples: list[dict], *, pad_token_id: int, flatten: bool = False) -> dict:
    """Stack packed rows (input_ids, labels, seq_lengths) into right-padded tensors with restarting
    positions; ``flatten`` concatenates them into one unpadded row instead (FlashAttention
    varlen)."""
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
    # a document's first token is never predicted from the one before it
    labels[positions == 0] = -100
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def _dtype(params: Train, cuda: bool):
    """Storage dtype of the loaded weights. Trained weights stay float32 (bf16 compute comes from
    autocast or FSDP2 mixed precision): a bf16 master copy loses every update below half a bf16
    step, which at lr 1e-5 is nearly all of them. Only a frozen adapter base is stored in bf16 on
    GPU."""
    import torch

    if params.dtype != "auto":
        name = params.dtype
    else:
        name = "bfloat16" if cuda and params.method != "full" else "float32"
    return getattr(torch, name)


def check_optimizer(params: Train) -> None:
    """``params.optim``'s package is installed here, on the machine that runs the job (the config
    is also parsed where it will not run): refused before any model loads, naming the package."""
    import importlib.util

    needs = OPTIMIZERS[params.optim]
    if needs is None:
        return
    module, package = needs
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"train.optim: {params.optim} needs the package {package} (module {module}), which "
            f"this environment ({sys.prefix}) lacks: install it on the training nodes, or use "
            "adamw_torch"
        )


def check_expert_parallel(base_dir, params: Train) -> None:
    """``params``' expert parallelism can split the experts of the model in ``base_dir`` evenly:
    checked on a meta-device build before any weight loads (transformers finds out mid-load)."""
    import re

    ep = params.layout.expert_parallel_size
    if ep == 1:
        return
    where = f"train.distributed.expert_parallel_size: {ep}"
    model = meta_model(base_dir)
    if params.quantize_moe_experts:
        # the staged NF4 loader splits any transformers-5 fused experts module
        from .nf4 import is_fused_experts

        counts = {m.num_experts for m in model.modules() if is_fused_experts(m)}
    else:
        dispatched = [
            re.compile(pattern.replace(".", r"\.").replace("*", r"\d+"))
            for pattern, style in model.ep_plan.items()
            if style == "ep_dispatch_experts"
        ]
        counts = {
            module.num_experts
            for name, module in model.named_modules()
            if any(p.fullmatch(name) for p in dispatched)
        }
    if not counts:
        raise ConfigError(
            f"{where}, but {type(model).__name__} ({base_dir}) has no experts to split "
            f"({'no fused experts' if params.quantize_moe_experts else 'no expert-parallel plan'}"
            "): drop the key"
        )
    if uneven := sorted(n for n in counts if n % ep):
        raise ConfigError(
            f"{where} does not divide the {', '.join(map(str, uneven))} experts per layer of "
            f"{base_dir}: each rank must hold as many experts"
        )


def attention(params: Train, cuda: bool) -> str:
    """The attention kernel to load the model with: FlashAttention exists only on GPU, so a GPU
    recipe run on CPU (its smoke twin) packs with sdpa; on GPU a missing flash-attn is an error
    (transformers names it), never a silent slowdown."""
    if "flash" in params.attn_implementation and not cuda:
        return "sdpa"
    return params.attn_implementation


def load_model(base_dir, params: Train):
    """The model to train, placed and sharded as ``params`` say: full precision, NF4 for QLoRA,
    FSDP2 shards across the processes of its layout, or a device map across one process's GPUs."""
    import torch
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    dtype = _dtype(params, cuda)
    kwargs = launch.load_kwargs(params)
    if params.load_in_4bit:
        # a whole 4-bit replica on this process's device, unless a map spreads it
        kwargs["quantization_config"] = quantization_config(dtype)
        kwargs.setdefault(
            "device_map", {"": int(os.environ.get("LOCAL_RANK", "0"))} if cuda else "cpu"
        )
    model = AutoModelForCausalLM.from_pretrained(
        Path(base_dir), attn_implementation=attention(params, cuda), dtype=dtype, **kwargs
    )
    # a cache disables the packed-document mask (module docstring)
    model.config.use_cache = False
    if params.load_in_4bit and not cuda:
        disable_cpu_repacking(model)
    return model


def device_budgets(params: Train, cuda: bool) -> dict:
    """Bytes each device of a device-map process may hold, by device (GPU index; the CPU without
    GPUs), as transformers reads max_memory: gpu_memory_limit / max_memory where given, else
    each GPU's free memory. The staged NF4 loader spreads its layers over them."""
    from accelerate.utils import get_max_memory

    budgets = get_max_memory(launch.load_kwargs(params).get("max_memory"))
    if cuda:
        return {k: v for k, v in sorted(budgets.items(), key=str) if isinstance(k, int)}
    return {"cpu": budgets["cpu"]}


def load_staged_model(base_dir, params: Train, seed: int = 0, log: Callable[[str], Any] = print):
    """QLoRA with every weight matrix in torchao NF4, fused experts included
    (``quantize_moe_experts``): the PEFT model built by the staged loader, each layer read,
    quantised, given its LoRA and FSDP2-sharded over this job's processes before the next is
    read (or, with a device map, placed on its GPU, ``device_budgets``). Sharded, it is marked
    as sharded at load time, so the Trainer neither wraps it in DDP nor shards it again, and
    defers gradient reduction across accumulation steps as it does for transformers' own
    load-time FSDP2."""
    import math

    import torch
    from transformers.distributed import DistributedConfig

    from .nf4 import SHARDS, load_staged

    cuda = torch.cuda.is_available()
    layout = params.layout
    mesh = launch.fsdp_mesh(layout, cuda) if params.sharded else None
    experts = None
    if layout.expert_parallel_size > 1:
        import torch.distributed as dist

        # consecutive ranks (on one node, under the FSDP dimension) split the experts
        experts, _ = dist.new_subgroups(group_size=layout.expert_parallel_size)
    model = load_staged(
        Path(base_dir),
        lora_config(params.lora),
        mesh=mesh,
        max_memory=device_budgets(params, cuda) if params.device_map is not None else None,
        dtype=_dtype(params, cuda),
        # the same quantised values on every layout whose shards divide 8; more shards otherwise
        shards=math.lcm(SHARDS, layout.fsdp_size),
        seed=seed,
        # the kernel the recipe names (FlashAttention on GPU), as load_model passes it
        attn_implementation=attention(params, cuda),
        log=log,
        expert_group=experts,
    )
    if mesh is not None:
        model.is_distributed_loading_by_transformers = True
        model.config.distributed_config = DistributedConfig(
            fsdp_size=layout.fsdp_size, dp_replicate_size=layout.dp_replicate_size
        )
    return model


def build_trainer(
    base_dir,
    encoded: list[dict],
    params: Train,
    output_dir,
    callbacks=(),
    resume: str | None = None,
    seed: int = 0,
    log: Callable[[str], Any] = print,
):
    """The SFTTrainer for ``encoded`` examples (``encode_examples``), the model loaded fresh from
    ``base_dir``."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    cuda = torch.cuda.is_available()
    sharded = params.sharded
    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    staged = params.quantize_moe_experts
    model = (
        load_staged_model(base_dir, params, seed, log) if staged else load_model(base_dir, params)
    )
    config = SFTConfig(
        output_dir=str(output_dir),
        learning_rate=params.lr,
        num_train_epochs=params.epochs,
        max_steps=params.max_steps,
        per_device_train_batch_size=params.batch_size,
        gradient_accumulation_steps=params.grad_accum,
        warmup_steps=params.warmup_ratio,  # a float < 1 is a ratio in transformers 5
        lr_scheduler_type=params.lr_scheduler,
        weight_decay=params.weight_decay,
        seed=seed,
        data_seed=seed,
        logging_steps=params.logging_steps,
        logging_first_step=True,
        max_length=params.max_length,
        packing=True,
        packing_strategy="bfd",
        # the rows come tokenized with their assistant masks (templates.py), which TRL turns into
        # labels; its own assistant_only_loss would render them again with a template of its choice
        assistant_only_loss=False,
        use_cpu=not cuda,
        bf16=cuda,  # bf16 autocast on GPU, whatever the storage dtype
        include_num_input_tokens_seen="non_padding",
        # Sharded runs checkpoint through their own callback, and save_minutes through one that
        # sets should_save (checkpoints.py)
        save_strategy="steps" if params.save_steps and not sharded else "no",
        save_steps=params.save_steps or 500,
        save_total_limit=2,
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
        # TRL turns it on by default: needless recompute at student sizes, essential at 16k on a
        # large model
        gradient_checkpointing=params.gradient_checkpointing,
        optim=params.optim,
    )
    dataset = Dataset.from_list(encoded)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=list(callbacks),
        # the staged loader's model carries its adapter already
        peft_config=lora_config(params.lora) if params.lora and not staged else None,
    )
    # TRL refuses a custom collator with BFD packing (it assumes flash-attention varlen); swap it in
    # after.
    trainer.data_collator = functools.partial(
        collate_packed_rows,
        pad_token_id=tokenizer.pad_token_id,
        flatten="flash" in attention(params, cuda),
    )
    # progress goes through our own log callable
    trainer.remove_callback(PrinterCallback)
    clock = SaveClock(params.save_minutes)
    if sharded and params.checkpointing:
        trainer.add_callback(
            sharded_checkpoints(
                Path(output_dir),
                params.save_steps,
                resume,
                adapter_only=params.lora is not None,
                clock=clock,
            )
        )
        # The Trainer cannot load weights into a load-time-sharded model; the callback restores
        # them.
        trainer._load_from_checkpoint = lambda *args, **kwargs: None
    elif params.save_minutes:
        # the Trainer's own checkpoints (and resume), asked for by time as well as by save_steps
        trainer.add_callback(timed_saves(clock))
    return trainer


def place_tags(examples: list[dict], where: EffortTagIn) -> list[dict]:
    """The rows with their effort tag (the system turn of a tagged row, as the dataset stage
    writes it) where ``student.effort_tag_in`` puts it."""
    if where == "system":
        return examples
    return [
        {**ex, "messages": with_effort_tag(ex["messages"][1:], ex["messages"][0]["content"], where)}
        if ex.get("tagged") and ex["messages"][0]["role"] == "system"
        else ex
        for ex in examples
    ]


def encode_checked(
    tokenizer, template, examples: list[dict], max_length: int, source: str = "dataset"
) -> tuple[list[dict], dict]:
    """The rows' tokens and assistant masks under ``template``, and the outcome of checking them
    (``check_supervision``): a template that refuses the rows' system turn, fails to render
    them, or supervises anything but each assistant turn as written is refused here, before
    any training step."""
    check_system_turn(tokenizer, template, examples)
    check_renders(
        tokenizer,
        [{**ex, "messages": template.fed(ex["messages"])} for ex in examples],
        source=source,
        chat_template=template.text,
        template_name=template.name,
        hint=": set train.chat_template to a template that renders them",
    )
    encoded = encode_examples(tokenizer, template, examples)
    return encoded, check_supervision(tokenizer, template, examples, encoded, max_length)


def select_rows(examples: list[dict], phase: TrainPhase | None, source: str) -> list[dict]:
    """The rows a phase trains on: its efforts, with the effort tags dropped if it says so."""
    if phase is None:
        return examples
    rows = []
    for ex in examples:
        if phase.efforts is not None:
            if "effort" not in ex:
                raise DataError(
                    f"{source}: row {ex['id']} has no 'effort', but train phase '{phase.name}' "
                    f"selects rows by effort ({', '.join(phase.efforts)})"
                )
            if ex["effort"] not in phase.efforts:
                continue
        if phase.tags == "none" and ex.get("tagged") and ex["messages"][0]["role"] == "system":
            ex = {**ex, "messages": ex["messages"][1:], "tagged": False}
        rows.append(ex)
    if not rows:
        raise DataError(
            f"{source}: no rows for train phase '{phase.name}' (efforts {phase.efforts}; the "
            f"dataset has {sorted({ex.get('effort') for ex in examples}, key=str)})"
        )
    return rows


def checkpoint_fingerprint(
    made_with: Mapping[str, Any], base_dir, dataset_path, template_text: str
) -> dict:
    """What a preemption checkpoint must have been made with to be resumed: ``made_with`` (the train
    section and the settings beside it, as ``train_sft`` takes them), base, dataset and template.
    save_minutes is left out: when checkpoints were written does not change the weights, so a job
    resubmitted with another interval still resumes (save_steps stays in: a resumed Trainer keeps
    the checkpoint's step interval)."""
    return {
        "params": {k: v for k, v in made_with.items() if k != "save_minutes"},
        "base": digest(base_dir)["sha256"],
        "dataset": digest(dataset_path)["sha256"],
        "chat_template": hashlib.sha256(template_text.encode()).hexdigest(),
    }


def train_sft(
    base_dir,
    dataset_path,
    out_dir,
    chat_template=None,
    *,
    params: Mapping[str, Any] | Train,
    seed: int,
    weight_hooks: Sequence[Mapping[str, Any] | WeightHook] = (),
    phase: Mapping[str, Any] | TrainPhase | None = None,
    effort_tag_in: EffortTagIn = Student.model_fields["effort_tag_in"].default,
    threads: int = 1,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Fine-tune the model in ``base_dir`` on ``dataset_path`` with the train section ``params``,
    ``seed``, the student's ``weight_hooks`` and ``effort_tag_in``, and this job's ``phase`` of
    train.phases (all of the rows when None); rendered with ``chat_template`` or the one
    ``training_template`` finds; save it to ``out_dir`` with its own template (LoRA / QLoRA: the
    adapter, which ``stream_merge`` merges into the base); return metrics. In a torchrun worker
    every rank runs this; rank 0 alone writes files and logs."""
    import torch
    from transformers import AutoTokenizer

    from .hooks import WeightHooks, step_callback  # loads torch

    p = Train.parse(params, where="train")
    hooks_given = [
        WeightHook.parse(h, where=f"weight_hooks.{i}") for i, h in enumerate(weight_hooks)
    ]
    phase = None if phase is None else TrainPhase.parse(phase, where="train.phase")
    check_optimizer(p)
    check_expert_parallel(base_dir, p)
    if p.lora:
        resolve_targets(base_dir, p.lora)
    main = launch.rank() == 0
    torch.set_num_threads(threads)
    examples = select_rows(load_conversations(dataset_path), phase, str(dataset_path))
    examples = place_tags(examples, effort_tag_in)
    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    template = training_template(tokenizer, chat_template, where=str(base_dir))
    encoded, checked = encode_checked(
        tokenizer, template, examples, p.max_length, source=str(dataset_path)
    )
    ids = [ex["id"] for ex in examples]
    stats = supervision_stats(encoded, ids, p.max_length, source=str(dataset_path))
    log(
        f"chat template for training: {template.name}; supervision checked on "
        f"{checked['rows_checked']} rows"
        + (f", reasoning fed as {template.reasoning_field}" if template.reasoning_field else "")
    )
    log(
        f"{stats['examples']} examples, {stats['supervised_tokens']} supervised of "
        f"{stats['total_tokens']} tokens ({stats['truncated']} truncated at max_length "
        f"{p.max_length})"
    )
    # Checkpoints live beside the output (which appears only when training is done), so a job killed
    # by preemption or wall time resumes there; a fingerprint keeps a changed run from resuming a
    # stale one.
    checkpoints = Path(str(out_dir).rstrip("/") + ".checkpoints")
    fingerprint, last = None, None
    if p.checkpointing:
        made_with = {
            **p.dump(),
            "seed": seed,
            "weight_hooks": [h.dump() for h in hooks_given],
            "phase": None if phase is None else phase.dump(),
            "effort_tag_in": effort_tag_in,
        }
        fingerprint = checkpoint_fingerprint(made_with, base_dir, dataset_path, template.text)
        last = last_checkpoint(checkpoints, fingerprint, log, main)
    sampled: dict[str, dict] = {}
    callbacks = [progress_callback(log)] if main else []
    hooks = WeightHooks(hooks_given)
    if hooks or p.sampled_options:
        callbacks.append(step_callback(hooks, p.sampled_options, seed, sampled))
    # Every rank takes part in gathering the sharded weights for the save; only rank 0 keeps a
    # directory.
    with atomic_dir(out_dir) if main else tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trainer = build_trainer(
            base_dir,
            encoded,
            p,
            checkpoints,
            callbacks=callbacks,
            resume=last,
            seed=seed,
            log=log if main else lambda _: None,
        )
        breakdown = trainable_breakdown(trainer.model)
        four_bit = {k: v for k, v in breakdown["four_bit_weights"].items() if v}
        log(
            f"trainable parameters {breakdown['trainable']} of {breakdown['parameters_total']:,} "
            f"({breakdown['adapter_bytes'] / 2**20:.2f} MiB)"
            + (f"; weight tensors in 4 bits {four_bit}" if four_bit else "")
        )
        packed = trainer.train_dataset
        real = sum(len(ids) for ids in packed["input_ids"])
        start = time.perf_counter()
        if p.checkpointing and main:
            checkpoints.mkdir(parents=True, exist_ok=True)
            write_json(checkpoints / "fingerprint.json", fingerprint)
        trainer.train(resume_from_checkpoint=last)
        seconds = time.perf_counter() - start
        peaks = launch.peak_memory_mib()  # every rank's, gathered while all of them are here
        model = trainer.accelerator.unwrap_model(trainer.model)
        state = None
        if p.sharded:
            state = gather_adapter(model) if p.lora else launch.gather_state(model)
        if main:
            end_of_turn = template.end_of_turn(tokenizer)
            if p.lora:
                # The adapter alone: rule merge_adapter, a CPU job, streams it into the
                # full-precision base (for QLoRA the original bf16 checkpoint, never the NF4
                # weights trained against), so this GPU job never holds the merged model.
                save_adapter_for_inference(model, tokenizer, base_dir, tmp, end_of_turn, state)
                check_saved_adapter(tmp, base_dir, p.lora)
            else:
                if state is not None:
                    model = launch.unsharded(model, state)
                save_for_inference(model, tokenizer, base_dir, tmp, end_of_turn=end_of_turn)
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
        # counted, not the rate times the time: the cost ledger's tokens are the same every run
        "tokens_seen": int(trainer.state.num_input_tokens_seen),
        "tokens_per_second": round(trainer.state.num_input_tokens_seen / max(seconds, 1e-9), 1),
        "packing_efficiency": round(real / (len(packed) * p.max_length), 4),
        "world_size": p.layout.world_size,
        "peak_memory_mib": peaks,
        "chat_template": template.origin,
        "template_check": checked,
        **({"sampled_options": sampled} if sampled else {}),
        **breakdown,
    }
    log(
        f"trained {metrics['steps']} steps in {seconds:.1f} s "
        f"({metrics['tokens_per_second']:.0f} tokens/s), "
        f"loss {metrics['first_loss']} -> {metrics['final_loss']}"
    )
    return metrics


if __name__ == "__main__":
    # the entry point of the workers launch.spawn starts
    launch.serve(train_sft)
