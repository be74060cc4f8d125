"""A few QLoRA steps with the base in NF4 (experts included), on one process or on every rank of
an FSDP2 job: the target test_nf4 runs in-process and through the launcher's workers."""

import os

import torch


def token_blocks(base, dataset, steps: int, rows: int, seq: int) -> torch.Tensor:
    """(steps, rows, seq) token ids of the dataset's text, repeated as needed: every row is full,
    so each rank's mean loss weighs as many tokens as every other's."""
    from transformers import AutoTokenizer

    from stillroom.io import read_jsonl

    text = " ".join(m["content"] for row in read_jsonl(dataset) for m in row["messages"])
    ids = torch.tensor(AutoTokenizer.from_pretrained(base)(text)["input_ids"])
    need = steps * rows * seq
    return ids.repeat(need // ids.numel() + 1)[:need].view(steps, rows, seq)


def qlora_steps(*, base, dataset, out_dir, lora, steps, rows, seq, lr, seed, staged, threads, log):
    """Train LoRA over the NF4 base for ``steps`` steps of ``rows`` rows (split over the ranks),
    save the adapter to ``out_dir``; the per-step mean losses and whether every router kept its
    exact weights. The model is loaded whole then quantised and sharded, or by the staged
    loader."""
    from pathlib import Path

    import torch.distributed as dist
    from peft import LoraConfig
    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from stillroom.runtime.nf4 import (
        NF4Experts,
        NF4Linear,
        fully_shard_layers,
        load_staged,
        nf4_lora,
        quantize_nf4,
        save_adapter,
    )

    torch.set_num_threads(threads)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    blocks = token_blocks(base, dataset, steps, rows, seq)
    routers = {
        k: v
        for k, v in load_file(Path(base) / "model.safetensors").items()
        if k.endswith("mlp.gate.weight")
    }
    if staged:
        model = load_staged(base, LoraConfig(**lora), dtype=torch.float32, seed=seed, log=log)
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model.config.use_cache = False
        quantize_nf4(model)
        model = nf4_lora(model, LoraConfig(**lora), seed=seed)
        if world > 1:
            fully_shard_layers(model)
    counts = {
        "linear": sum(isinstance(m, NF4Linear) for m in model.modules()),
        "experts": sum(isinstance(m, NF4Experts) for m in model.modules()),
    }
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for step in range(steps):
        batch = blocks[step].chunk(world)[rank]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        if world > 1:
            dist.all_reduce(mean)
            mean /= world
        losses.append(mean.item())
        log(f"step {step} loss {losses[-1]:.6f}")
    save_adapter(model, out_dir, write=rank == 0)
    after = {
        n.removeprefix("base_model.model."): (p.full_tensor() if isinstance(p, DTensor) else p)
        for n, p in model.named_parameters()
        if n.endswith("mlp.gate.weight")
    }
    unchanged = after.keys() == routers.keys() and all(
        torch.equal(routers[n], after[n]) for n in routers
    )
    if world > 1:
        dist.destroy_process_group()
    return {"losses": losses, "quantized": counts, "routers_unchanged": unchanged}
