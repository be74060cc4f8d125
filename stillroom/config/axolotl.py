"""Axolotl's training keys, as the MoE guide (Beam's) and Axolotl's MoE examples write them, that
train takes under another name or not at all: each is refused naming where its setting goes here,
why there is nothing to set, or (NOT_SHIPPED) what this repository does not ship. Keys train takes
under the same name and meaning are not listed (load_in_4bit, quantize_moe_experts,
gpu_memory_limit, max_memory, device_map, attn_implementation, gradient_checkpointing,
lr_scheduler, warmup_ratio, weight_decay, max_steps, save_steps, logging_steps). Axolotl's data,
output and tracker keys (datasets, output_dir, wandb_*) are not train's: the pipeline builds its
data and outputs from its own sections."""

from __future__ import annotations

from typing import Any

_FSDP = "train.distributed (FSDP2 over its processes: nodes, gpus_per_node, fsdp_size)"
_LIGER = "Liger Kernel's fused Triton kernels (the model runs transformers' own layers)"
_LORA_KERNELS = "Axolotl's fused LoRA Triton kernels (PEFT's LoRA layers run here)"
# what Axolotl's Cut Cross Entropy saves, the loss here saves already
_CCE = (
    "Cut Cross Entropy (the cut-cross-entropy package), nor needs it: the loss here is TRL's "
    "fused LM head, which like it never holds the logits (stillroom/plan/estimate.py counts it)"
)

# Axolotl's key -> the key (full name) that sets the same thing here, with what differs
ELSEWHERE = {
    "base_model": "student.pretrained",
    "learning_rate": "train.lr",
    "num_epochs": "train.epochs",
    "micro_batch_size": "train.batch_size (rows per process and step)",
    "gradient_accumulation_steps": "train.grad_accum",
    "sequence_len": "train.max_length (tokens per packed row)",
    "optimizer": "train.optim (transformers' optimizer names, as Axolotl's)",
    "adapter": "train.method (lora or qlora; full for no adapter)",
    "lora_r": "train.lora.r",
    "lora_alpha": "train.lora.alpha",
    "lora_dropout": "train.lora.dropout",
    "lora_target_modules": "train.lora.target_modules",
    "lora_target_parameters": "train.lora.target_parameters",
    "lora_target_linear": "train.lora.target_modules, naming the projections (q_proj, ...)",
    "expert_parallel_size": "train.distributed.expert_parallel_size",
    "dp_shard_size": "train.distributed.fsdp_size",
    "fsdp": _FSDP,
    "fsdp_config": _FSDP,
    "fsdp_version": _FSDP,
    "warmup_steps": "train.warmup_ratio (a fraction of the steps)",
    "flash_attention": "train.attn_implementation: flash_attention_2",
    "bf16": "train.dtype (auto: float32 weights and bf16 compute on GPU; bfloat16: a bf16 base)",
    "seed": "seed (the experiment's, at the config's top level)",
    "saves_per_epoch": "train.save_steps or train.save_minutes",
    "resume_from_checkpoint": "train.save_steps or train.save_minutes (a killed job resumes "
    "from its latest checkpoint by itself)",
}

# Axolotl's key -> why there is nothing to set here
NOTHING_TO_SET = {
    "sample_packing": "rows are always packed (TRL's best-fit packing, with document masks)",
    "pad_to_sequence_len": "packed rows are train.max_length tokens",
    "strict": "every key is checked here",
    "load_in_8bit": "an 8-bit base is not wired; QLoRA here is NF4 (load_in_4bit)",
    "fp16": "compute is bf16 on GPU (train.dtype)",
    "tf32": "float32 matmuls run at torch's default precision",
    "gradient_checkpointing_kwargs": "train.gradient_checkpointing takes transformers' defaults",
    "experts_implementation": "the experts run transformers' default implementation",
    "model_type": "the model class is transformers' Auto class for the checkpoint",
    "tokenizer_type": "the tokenizer is transformers' Auto class for the checkpoint",
    "trust_remote_code": "models load with transformers' own code only",
    "model_config": "the checkpoint's config is used as it is (train.sampled_options samples "
    "config attributes per step)",
    "lora_model_dir": "training from a saved adapter is not wired",
    "lora_modules_to_save": "modules_to_save is not wired (the adapter merge refuses it)",
    "unfrozen_parameters": "partial unfreezing is not wired (method full trains every weight)",
    "torch_compile": "the model runs eagerly; torch.compile is not wired",
    "evals_per_epoch": "training evaluates nothing; the eval stage scores each checkpoint",
    "val_set_size": "training evaluates nothing; the eval stage scores each checkpoint",
}

# Axolotl's key -> what this repository does not ship (Section.not_shipped: by value for a
# mapping; a list's entries, Axolotl's plugins, by their class, None for any other)
NOT_SHIPPED: dict[str, str | dict[Any, str]] = {
    "plugins": {
        "CutCrossEntropyPlugin": _CCE,
        "LigerPlugin": _LIGER,
        "KernelsPlugin": "the kernels plugin's expert kernels (ScatterMoE, SonicMoE; the "
        "experts run transformers' own forward)",
        "ExpertParallelPlugin": "Axolotl's expert-parallel plugin (set "
        "train.distributed.expert_parallel_size)",
        None: "Axolotl's plugins",
    },
    "cut_cross_entropy": _CCE,
    "use_scattermoe": "ScatterMoE's Triton expert kernels (the experts run transformers' own "
    "forward)",
    "use_kernels": "the Hugging Face kernels hub's kernels",
    "autotune_profiles": "the ScatterMoE LoRA kernels whose Triton tiles it pins",
    "autotune_neighborhood": "the ScatterMoE kernels whose Triton autotune search it narrows",
    "lora_mlp_kernel": _LORA_KERNELS,
    "lora_qkv_kernel": _LORA_KERNELS,
    "lora_o_kernel": _LORA_KERNELS,
    "liger_rms_norm": _LIGER,
    "liger_glu_activation": _LIGER,
    "liger_layer_norm": _LIGER,
    "liger_rope": _LIGER,
    "liger_rms_norm_gated": _LIGER,
    "liger_fused_linear_cross_entropy": _LIGER,
    "activation_offloading": "Axolotl's activation offloading (train.gradient_checkpointing "
    "recomputes activations instead)",
    "model_quantization_config": "transformers' quantised-checkpoint loading (Mxfp4Config; "
    "QLoRA here quantises a bf16 checkpoint to NF4)",
    "deepspeed": "DeepSpeed (train.distributed is FSDP2)",
    "llama4_linearized_experts": "Axolotl's linearised Llama 4 experts",
}

# Axolotl's key -> the whole refusal, as Section.foreign takes it
FOREIGN = {
    **{key: f"Axolotl's key; here it is {where}" for key, where in ELSEWHERE.items()},
    **{
        key: f"Axolotl's key, nothing to set here: {why}; drop it"
        for key, why in NOTHING_TO_SET.items()
    },
}
