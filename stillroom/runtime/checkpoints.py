"""Checkpoints of a training job: preemption checkpoints (resumed only by a run of the same params
and inputs), their FSDP2-sharded form, and the final model saved for inference.

transformers 5 will not checkpoint the optimizer of a model sharded at load time, and resuming with
the weights alone would silently restart Adam's moments and the lr schedule. Here every rank writes
its own shards of the model and optimizer state with torch.distributed.checkpoint (no gather on
rank 0: at 501B that would be a terabyte through one process), and rank 0 adds the scheduler and
trainer state. The Trainer's own resume then restores the step and data position, and this
callback the rest.

Checkpoints are written every ``train.save_steps`` steps and, by default, every
``train.save_minutes`` of training (``SaveClock``): a preempted job loses at most that much
however long its steps are. The time is rank 0's, so every rank saves at the same step.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from .saving import save_pretrained


def _states(model, optimizer, options=None) -> dict:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return {
        "model": get_model_state_dict(model, options=options),
        "optim": get_optimizer_state_dict(model, optimizer, options=options),
    }


def rank0_decides(flag: bool, device) -> bool:
    """Rank 0's ``flag``, on every rank of the job (as is, in one process). A checkpoint is a
    collective under FSDP (and a barrier under DDP): ranks that decided by their own clocks could
    fall on either side of the interval at one step and hang there."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    # on the device the job's backend reduces on (args.device: the rank's GPU for NCCL, else CPU)
    decision = torch.tensor([int(flag)], dtype=torch.int32, device=device)
    dist.broadcast(decision, src=0)
    return bool(decision.item())


class SaveClock:
    """When ``minutes`` of training have passed since training (re)started or the last checkpoint
    was written (0: never). Every rank asks at each step end and gets rank 0's answer."""

    def __init__(self, minutes: float, clock: Callable[[], float] = time.monotonic):
        self.minutes = minutes
        self.clock = clock
        self.since = clock()

    def restart(self) -> None:
        self.since = self.clock()

    def due(self, state, device) -> bool:
        """Whether to checkpoint at this step end. Never at the last step (the trained model is
        saved right after it); the same answer on every rank, which all call this at each step."""
        if not self.minutes or state.global_step >= state.max_steps:
            return False
        return rank0_decides(self.clock() - self.since >= 60 * self.minutes, device)


def timed_saves(clock: SaveClock):
    """A TrainerCallback asking the Trainer for a checkpoint whenever ``clock`` says so: its own
    save, retention (save_total_limit) and resume, as for a step-based one."""
    from transformers import TrainerCallback

    class TimedSaves(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.restart()  # loading the model (and a checkpoint) is not training time

        def on_step_end(self, args, state, control, **kwargs):
            if clock.due(state, args.device):
                control.should_save = True

        def on_save(self, args, state, control, **kwargs):
            clock.restart()  # after every checkpoint, a save_steps one too

    return TimedSaves()


def sharded_checkpoints(
    directory: Path,
    every: int,
    resume: str | None,
    keep: int = 2,
    adapter_only: bool = False,
    clock: SaveClock | None = None,
):
    """A TrainerCallback saving ``directory/checkpoint-<step>`` every ``every`` steps (0: not by
    steps) and whenever ``clock`` says so, and restoring ``resume`` (one such directory) when
    training begins. ``adapter_only``: the frozen base is left out (it is reloaded from the base
    checkpoint), so a LoRA checkpoint of a 501B model holds the adapter and its optimizer state,
    not the base again (nor NF4 tensors, which torch.distributed.checkpoint does not write)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from transformers import TrainerCallback

    options = StateDictOptions(ignore_frozen_params=adapter_only, strict=not adapter_only)
    clock = clock or SaveClock(0)

    class ShardedCheckpoints(TrainerCallback):
        def on_train_begin(
            self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs
        ):
            if not resume:
                clock.restart()
                return
            states = _states(model, optimizer, options)
            dcp.load(states, checkpoint_id=Path(resume) / "dcp")
            set_model_state_dict(model, states["model"], options=options)
            set_optimizer_state_dict(model, optimizer, states["optim"], options=options)
            lr_scheduler.load_state_dict(
                torch.load(Path(resume) / "scheduler.pt", weights_only=True)
            )
            clock.restart()  # restoring is not training time

        def on_step_end(
            self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs
        ):
            by_steps = bool(every) and state.global_step % every == 0
            if not by_steps and not clock.due(state, args.device):
                return
            target = directory / f"checkpoint-{state.global_step}"
            dcp.save(_states(model, optimizer, options), checkpoint_id=target / "dcp")
            # Each rank's RNG state, in the Trainer's own file layout so its resume restores it
            # (dropout).
            rng = {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "cpu": torch.random.get_rng_state(),
            }
            if torch.cuda.is_available():
                rng["cuda"] = torch.cuda.random.get_rng_state_all()
            torch.save(rng, target / f"rng_state_{dist.get_rank()}.pth")
            # every rank's files are in before rank 0 marks the checkpoint complete
            dist.barrier()
            if dist.get_rank() == 0:
                torch.save(lr_scheduler.state_dict(), target / "scheduler.pt")
                # written last: marks it complete
                state.save_to_json(str(target / "trainer_state.json"))
                done = sorted(
                    directory.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])
                )
                for old in done[:-keep]:
                    shutil.rmtree(old, ignore_errors=True)
            dist.barrier()
            clock.restart()

    return ShardedCheckpoints()


def last_checkpoint(checkpoints: Path, fingerprint: Mapping, log, main: bool = True) -> str | None:
    """The newest complete checkpoint made with this fingerprint. Only the main rank deletes stale
    or incomplete ones (the others read the same directory and come to the same answer), so no rank
    can remove what another has just written."""
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
        # A kill during a save leaves no trainer_state.json: it is written last (by transformers,
        # and by sharded_checkpoints after every rank's shards and RNG state are in).
        if (candidate / "trainer_state.json").exists():
            log(f"resuming from {candidate}")
            return str(candidate)
        if main:
            log(f"discarding incomplete {candidate}")
            shutil.rmtree(candidate, ignore_errors=True)
    return None


def inference_generation_config(model, tokenizer, base_dir, end_of_turn: int | None = None):
    """The generation config a trained model is served with: the base's (or, when the base has
    none, a student's own), with ``end_of_turn`` (the token the model was trained to end its turn
    with) among its stop tokens: a base model's is end-of-text (Qwen3-Base's ``<|endoftext|>``),
    and a server (SGLang, vLLM, transformers serve) stops only there, so a chat-tuned model would
    run past its ``<|im_end|>`` to the token limit."""
    from .student import generation_config

    if (Path(base_dir) / "generation_config.json").exists():
        config = copy.deepcopy(model.generation_config)
    else:
        config = generation_config(tokenizer)
    if end_of_turn is not None:
        eos = config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if end_of_turn not in eos:
            config.eos_token_id = [*eos, end_of_turn]
    return config


def save_for_inference(model, tokenizer, base_dir, out_dir, end_of_turn: int | None = None) -> None:
    """A trained model as the stages after training load it: the KV cache back on, the generation
    config it is served with (``inference_generation_config``), and the tokenizer beside the
    weights."""
    model.config.use_cache = True
    model.generation_config = inference_generation_config(model, tokenizer, base_dir, end_of_turn)
    save_pretrained(model, out_dir)
    save_pretrained(tokenizer, out_dir)


def save_adapter_for_inference(
    model, tokenizer, base_dir, out_dir, end_of_turn: int | None = None, state_dict=None
) -> None:
    """A PEFT model's adapter in PEFT's format (``state_dict``: the adapter gathered from FSDP
    shards), with the tokenizer and generation config the merged model is served with: the adapter
    merge (runtime/adapter_merge.py) puts them beside the merged weights."""
    save_pretrained(model, out_dir, state_dict=state_dict)
    save_pretrained(inference_generation_config(model, tokenizer, base_dir, end_of_turn), out_dir)
    save_pretrained(tokenizer, out_dir)


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_length(model_dir) -> int | None:
    """The context (prompt plus new tokens) a checkpoint was built for, from its config.json; None
    for a model that is not a local checkpoint or does not say."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    config = config.get("text_config", config)  # multimodal checkpoints nest the language model's
    return next((int(config[k]) for k in CONTEXT_KEYS if config.get(k)), None)
