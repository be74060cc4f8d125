"""The student and how it is trained: its shape or pretrained source, SFT (full, LoRA, QLoRA) and
its process layout, GRPO on kernel problems, and the weight merges."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from string import Template
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from . import axolotl
from .base import Effort, Plain, PositiveInt, Regex, Section
from .routers import ROUTER_NAMES, router_role

# LoRA on a parameter that expert parallelism shards (PEFT's ParamWrapper, i.e. target_parameters
# on the fused experts) fails in the first forward, on any backend: PEFT adds its plain-tensor
# delta to the expert DTensor before transformers' dispatch swaps in the local shard (measured on 2
# gloo ranks, transformers 5.24, peft 0.21; tests/runtime/test_expert_parallel.py re-runs it).
EP_PARAMETER_ERROR = (
    "aten.baddbmm.default got mixed torch.Tensor and DTensor, need to convert all torch.Tensor "
    "to DTensor before calling distributed operators!"
)
EP_PARAMETER_LORA = (
    "PEFT's LoRA on expert-parallel fused experts fails in the forward on any backend "
    f"(RuntimeError: {EP_PARAMETER_ERROR}); put LoRA on target_modules only (attention, dense "
    "MLP), or drop expert_parallel_size"
)

# transformers' optimizer names (its OptimizerNames), each with the package it needs beyond torch
# and transformers: (module imported, distribution to install). GaLore and APOLLO are left out:
# they need optim_target_modules, which train does not set.
_BNB = ("bitsandbytes", "bitsandbytes")
_TORCHAO = ("torchao", "torchao")
_SCHEDULE_FREE = ("schedulefree", "schedulefree")
OPTIMIZERS: dict[str, tuple[str, str] | None] = {
    "adamw_torch": None,
    "adamw_torch_fused": None,
    "adafactor": None,
    "sgd": None,
    "adagrad": None,
    "rmsprop": None,
    "adamw_torch_xla": ("torch_xla", "torch-xla"),
    "adamw_torch_npu_fused": ("torch_npu", "torch-npu"),
    "adamw_anyprecision": ("torchdistx", "torchdistx"),
    "adamw_torch_4bit": _TORCHAO,
    "adamw_torch_8bit": _TORCHAO,
    **dict.fromkeys(
        (
            "adamw_bnb_8bit",
            "adamw_8bit",
            "ademamix",
            "ademamix_8bit",
            "lion_8bit",
            "lion_32bit",
            "paged_adamw_32bit",
            "paged_adamw_8bit",
            "paged_ademamix_32bit",
            "paged_ademamix_8bit",
            "paged_lion_32bit",
            "paged_lion_8bit",
            "rmsprop_bnb",
            "rmsprop_bnb_8bit",
            "rmsprop_bnb_32bit",
        ),
        _BNB,
    ),
    "lomo": ("lomo_optim", "lomo-optim"),
    "adalomo": ("lomo_optim", "lomo-optim"),
    "grokadamw": ("grokadamw", "grokadamw"),
    "schedule_free_radam": _SCHEDULE_FREE,
    "schedule_free_adamw": _SCHEDULE_FREE,
    "schedule_free_sgd": _SCHEDULE_FREE,
    "stable_adamw": ("optimi", "torch-optimi"),
}
Optimizer = Literal[tuple(OPTIMIZERS)]
# torchao's low-bit AdamW: the 4-bit one is reported to fail once a device map spreads the
# adapters over several GPUs (not measurable here), and the 8-bit one runs the same step (one
# compiled update per parameter, with the lr and step counters as tensors made without a device).
# bitsandbytes' 8-bit optimizers move their quantisation maps to each parameter's device: allowed.
# Under FSDP2 torchao wraps its state in DTensors, and in a fresh inductor cache the sharded step
# equals one process's (max diff 0 on 2 gloo ranks, torch 2.13, torchao 0.18); but with the cache
# of a node (/tmp/torchinductor_$USER) a sharded step fails ("wrong number of dimensions") once
# the other low-bit AdamW ran sharded there: its compiled step is reused (torch warns that
# OptimState4bit / 8bit lack _stable_hash_for_caching). One process never hit it; DDP replicas
# hold plain tensors: allowed. tests/runtime/test_launch.py re-runs the failure.
ONE_DEVICE_OPTIMIZERS = ("adamw_torch_4bit", "adamw_torch_8bit")
# accelerate's device_map strategies, and the devices a dict's modules may go to
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_MAP_DEVICE = re.compile(r"cpu|disk|meta|cuda(?::[0-9]+)?|[0-9]+")
# a phase's checkpoint is ckpt/sft-<name>: these suffixes are another artifact's (a LoRA phase's
# adapter, a provenance sidecar) of the phase named without them
ARTIFACT_SUFFIXES = (".adapter", ".prov.json")

# Memory sizes for a device map as Axolotl reads gpu_memory_limit (axolotl loaders/model.py): an
# int is GiB, a string carries its unit. Units are case-sensitive: accelerate reads a lower-case b
# as bits ("80gb" is 10 GB). Passed on in bytes, so accelerate's parsing never sees them.
MEMORY_UNITS = {
    "TiB": 2**40,
    "GiB": 2**30,
    "MiB": 2**20,
    "KiB": 2**10,
    "TB": 10**12,
    "GB": 10**9,
    "MB": 10**6,
    "KB": 10**3,
}
# ASCII digits, the whole string (a `$` would also pass a trailing newline)
_MEMORY = re.compile(rf"([0-9]+(?:\.[0-9]+)?) ?({'|'.join(MEMORY_UNITS)})")
# one GPU's share of a device map: below a MiB no layer fits (the map puts every layer on disk),
# above 16TiB no GPU holds it (a unit slip: bytes written as an int, which is GiB)
MEMORY_RANGE = (2**20, 2**44)


def memory_bytes(size: int | str) -> int:
    """``size`` in bytes: an int is GiB (as Axolotl reads it; transformers would read bytes), a
    string is a number and a unit (80GiB, 80GB, 1.5TiB)."""
    if isinstance(size, int):
        nbytes = size * 2**30
    elif found := _MEMORY.fullmatch(size):
        nbytes = int(float(found[1]) * MEMORY_UNITS[found[2]])
    else:
        raise ValueError(
            "a memory size is an int of GiB or a number with a unit "
            f"({', '.join(MEMORY_UNITS)}), e.g. 80GiB; got {size!r}"
        )
    if nbytes <= 0:
        raise ValueError(f"a memory size is more than 0 bytes, got {size!r}")
    return nbytes


def _memory_size(size: int | str) -> int | str:
    memory_bytes(size)
    return size


def _device(key: int | str) -> int | str:
    if key == "cpu" or (isinstance(key, int) and key >= 0) or re.fullmatch("[0-9]+", str(key)):
        return key
    raise ValueError(f"a device of max_memory is a GPU index (0, 1, ...) or 'cpu', got {key!r}")


MemorySize = Annotated[int | str, AfterValidator(_memory_size)]

# Attention kernels transformers accepts that this repository can load: flash_attention_2 needs
# flash-attn on the GPU nodes (envs/stillroom.yaml); the rest are torch's own.
Attention = Literal["sdpa", "eager", "flash_attention_2", "flex_attention"]


class Tokenizer(Section):
    """A byte-level BPE trained on the pool."""

    vocab_size: Annotated[int, Field(ge=300, le=300_000)] = Field(
        description="tokens the BPE learns, special tokens included"
    )
    min_frequency: PositiveInt = Field(
        2, description="a pair merges only if it occurs at least this often in the pool"
    )
    pretokenize: Literal["words", "lines"] = Field(
        "words",
        description="words: GPT-2's split, no token crosses a word; lines: merges run along a "
        "line, so a line of code seen often becomes one token (short kernels)",
    )


MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")


class ModelShape(Section):
    """A student built with random weights: Qwen3, or Qwen3-MoE with the expert keys."""

    hidden_size: Annotated[int, Field(ge=8)] = Field(description="width of the residual stream")
    intermediate_size: Annotated[int, Field(ge=8)] = Field(description="width of the dense MLP")
    num_hidden_layers: PositiveInt = Field(description="decoder layers")
    num_attention_heads: PositiveInt = Field(description="query heads per layer")
    num_key_value_heads: PositiveInt = Field(
        description="key/value heads per layer; divides num_attention_heads (grouped-query "
        "attention)"
    )
    head_dim: Annotated[int, Field(ge=4)] = Field(description="width of one attention head")
    max_position_embeddings: Annotated[int, Field(ge=64)] = Field(
        description="the longest sequence, in tokens, the model holds"
    )
    tie_word_embeddings: bool = Field(
        description="the output layer shares the input embedding's weights"
    )
    rope_theta: float | None = Field(
        None, gt=0, description="RoPE base frequency (null: transformers' default)"
    )
    family: Literal["qwen3", "qwen3_moe"] = Field(
        "qwen3",
        description="qwen3: dense; qwen3_moe: mixture of experts (needs the three expert keys)",
    )
    num_experts: Annotated[int, Field(ge=2)] | None = Field(
        None, description="routed experts of every layer (qwen3_moe)"
    )
    num_experts_per_tok: PositiveInt | None = Field(
        None, description="experts each token runs (qwen3_moe)"
    )
    moe_intermediate_size: Annotated[int, Field(ge=8)] | None = Field(
        None, description="one expert's width (qwen3_moe)"
    )
    norm_topk_prob: bool | None = Field(
        None,
        description="renormalise the chosen experts' routing weights to sum to 1 (null: "
        "transformers' default)",
    )
    router_aux_loss_coef: float | None = Field(
        None,
        ge=0,
        description="weight of the router's load-balancing loss (null: transformers' default)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelShape:
        problems = []
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        given = [k for k in MOE_KEYS if getattr(self, k) is not None]
        if self.family == "qwen3_moe" and len(given) < len(MOE_KEYS):
            missing = ", ".join(k for k in MOE_KEYS if k not in given)
            problems.append(f"family: qwen3_moe needs {missing}")
        if self.family == "qwen3" and given:
            problems.append(f"family: {', '.join(given)} apply to family qwen3_moe only")
        if self.num_experts and (self.num_experts_per_tok or 0) > self.num_experts:
            problems.append(
                f"num_experts_per_tok: {self.num_experts_per_tok} is more than num_experts "
                f"({self.num_experts})"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self


class WeightHook(Section):
    """Re-normalise every vector along ``dim`` of the matching weights to L2 norm ``norm``, after
    every optimizer step and every merge (nGPT-style students)."""

    fn: Literal["renorm_rows"] = Field(
        description="the function applied: renorm_rows rescales each vector along dim to L2 norm "
        "norm"
    )
    match: Annotated[list[Regex], Field(min_length=1)] = Field(
        description="regular expressions searched in tensor names; each must match one"
    )
    dim: int = Field(
        -1, description="the dimension along which each vector is normalised (-1: rows of a weight)"
    )
    norm: float = Field(1.0, gt=0, description="the L2 norm each vector is rescaled to")
    eps: float = Field(
        1e-8, gt=0, description="the least norm divided by, so a zero vector stays finite"
    )


def hooks_problem(method: str, hooks: list[WeightHook]) -> str | None:
    """Why weight hooks cannot run with training ``method``, if they cannot."""
    if hooks and method != "full":
        return (
            "they re-normalise trained weights after each step; with an adapter (train.method "
            f"{method}) the base is frozen and they have nothing to act on"
        )
    return None


# where the student's effort tag goes: a system turn, or the head of the first user turn
EffortTagIn = Literal["system", "user"]


class Student(Section):
    pretrained: str | None = Field(
        None, description="a model directory or hub id (downloaded in a job, not at DAG build)"
    )
    tokenizer: Tokenizer | None = Field(
        None, description="a tokenizer trained on the pool (a student built from scratch)"
    )
    model: ModelShape | None = Field(
        None, description="the shape of a student built with random weights"
    )
    effort_tag: str = Field(
        pattern=r"\$effort", description="the student's effort syntax; $effort is replaced"
    )
    effort_tag_in: EffortTagIn = Field(
        "system",
        description="where the effort tag goes, in training and evaluation: a system turn, or "
        "the head of the user turn (for a chat template that takes no system turn)",
    )
    weight_hooks: list[WeightHook] = Field(
        [],
        description="functions applied to matching weights after every optimizer step and every "
        "merge",
    )

    @model_validator(mode="after")
    def _source(self) -> Student:
        if self.pretrained and (self.tokenizer or self.model):
            raise ValueError("pretrained: a pretrained student has no tokenizer or model to build")
        if not self.pretrained and not (self.tokenizer and self.model):
            raise ValueError(
                "pretrained: set it, or both tokenizer and model (a student built from scratch)"
            )
        try:
            tags = {Template(self.effort_tag).substitute(effort=e) for e in ("low", "high")}
        except (KeyError, ValueError) as exc:
            raise ValueError(f"effort_tag: only $effort may be substituted ({exc!r})") from None
        if len(tags) == 1:  # "$$effort" is a literal "$effort": every effort gets one tag
            raise ValueError(
                f"effort_tag: {self.effort_tag!r} has no $effort to substitute ($$ is a literal $)"
            )
        return self


class Lora(Section):
    r: PositiveInt = Field(description="the adapter's rank")
    alpha: float = Field(gt=0, description="LoRA scaling: the update is scaled by alpha / r")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="dropout on the adapter's input (below 1: 1 zeroes every input, and the "
        "adapter never learns)",
    )
    target_modules: list[str] = Field(
        [], description="names of the modules adapted (PEFT's target_modules)"
    )
    target_parameters: list[str] = Field([], description="fused MoE expert parameters")
    allow_router: bool = Field(
        False,
        description="adapt a MoE router anyway (a module named "
        f"{', '.join(ROUTER_NAMES)}: the router, or the shared expert's gate); it destabilises "
        "routing",
    )

    @model_validator(mode="after")
    def _targets(self) -> Lora:
        if not self.target_modules and not self.target_parameters:
            raise ValueError("target_modules: set target_modules and/or target_parameters")
        if self.target_parameters and self.dropout:
            raise ValueError(
                f"dropout: must be 0 with target_parameters (PEFT), got {self.dropout}"
            )
        # the early refusal by spelling; the loaded model is checked by what each target
        # resolves to (runtime/adapters.py)
        if not self.allow_router:
            problems = [
                f"{kind}: {', '.join(router)}; adapting it destabilises routing. Set "
                "allow_router: true to do it anyway"
                for kind, targets in (
                    ("target_modules", self.target_modules),
                    ("target_parameters", self.target_parameters),
                )
                if (router := [f"{t} is {role}" for t in targets if (role := router_role(t))])
            ]
            if problems:
                raise ValueError("\n".join(problems))
        return self


@dataclass(frozen=True)
class Layout:
    """The processes of a training job: nodes x gpus_per_node, FSDP2 shards of fsdp_size, replicated
    dp_replicate_size times (one process spreading a device map: world size 1)."""

    nodes: int
    gpus_per_node: int
    fsdp_size: int
    dp_replicate_size: int
    world_size: int
    # ranks of an FSDP group that split the experts between them (1: every rank holds them all)
    expert_parallel_size: int = 1


class Distributed(Section):
    """Processes: nodes x gpus_per_node, FSDP2-sharded (fsdp_size), replicated
    (dp_replicate_size); the MoE experts optionally split over the ranks of each FSDP group
    (expert_parallel_size)."""

    nodes: PositiveInt = Field(1, description="nodes the job runs on")
    gpus_per_node: PositiveInt = Field(
        1,
        description="GPUs on each node, a process each (one process over them with "
        "train.device_map)",
    )
    fsdp_size: PositiveInt | None = Field(
        None,
        description="ranks each FSDP2 group shards the model over (default: world size / "
        "dp_replicate_size)",
    )
    dp_replicate_size: PositiveInt = Field(
        1,
        description="replicas of the sharded model (HSDP: gradients all-reduced between them; 1: "
        "plain FSDP)",
    )
    expert_parallel_size: PositiveInt = Field(
        1,
        description="expert parallelism: each FSDP group's ranks split the MoE experts between "
        "them and send each token to its experts' rank (all-to-all); dense weights stay "
        "FSDP-sharded over the same ranks, so the world size is unchanged. Must divide fsdp_size "
        "and the model's expert count (checked when the job starts)",
    )

    @model_validator(mode="after")
    def _sizes(self) -> Distributed:
        world = self.nodes * self.gpus_per_node
        if self.fsdp_size is None and world % self.dp_replicate_size:
            raise ValueError(
                f"dp_replicate_size: {self.dp_replicate_size} does not divide the world size "
                f"{world} (nodes {self.nodes} x gpus_per_node {self.gpus_per_node})"
            )
        fsdp = self.fsdp_size or world // self.dp_replicate_size
        if fsdp * self.dp_replicate_size != world:
            raise ValueError(
                f"fsdp_size: {fsdp} x dp_replicate_size {self.dp_replicate_size} must equal the "
                f"world size {world} (nodes {self.nodes} x gpus_per_node {self.gpus_per_node})"
            )
        # transformers lays the experts over (dp_replicate, fsdp / ep, ep): an EP group lies
        # within one FSDP group, whose ranks then hold fsdp / ep copies of each expert
        if fsdp % self.expert_parallel_size:
            raise ValueError(
                f"expert_parallel_size: {self.expert_parallel_size} does not divide fsdp_size "
                f"{fsdp} (the experts are split over the ranks of one FSDP group; world size "
                f"{world})"
            )
        return self

    def layout(self, device_map: bool = False) -> Layout:
        if device_map:
            # one process spreads the layers over the node's GPUs
            return Layout(self.nodes, self.gpus_per_node, 1, 1, 1)
        world = self.nodes * self.gpus_per_node
        fsdp = self.fsdp_size or world // self.dp_replicate_size
        return Layout(
            self.nodes,
            self.gpus_per_node,
            fsdp,
            self.dp_replicate_size,
            world,
            self.expert_parallel_size,
        )


class TrainPhase(Section):
    """One phase of a phased fine-tune: its rows of the dataset and its epochs, starting from the
    previous phase's checkpoint."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.]+$",
        description="the phase's name: its checkpoint is ckpt/sft-<name> (the last phase's is the "
        "fine-tune)",
    )
    epochs: float = Field(gt=0, description="passes over the phase's rows")
    efforts: Annotated[list[Effort], Field(min_length=1)] | None = Field(
        None, description="the rows of these efforts (all: null)"
    )
    tags: Literal["as_built", "none"] = Field(
        "as_built",
        description="as_built: rows tagged as the dataset tags them; none: every effort tag "
        "dropped (the phase teaches the untagged default)",
    )
    distributed: Distributed | None = Field(
        None,
        description="this phase's processes, when they differ from train.distributed (e.g. a "
        "second phase on a whole node): its job's GPUs, SLURM shape and bill follow",
    )


class Train(Section):
    """Supervised fine-tuning: full parameters, LoRA, or QLoRA; packed with document masks."""

    not_shipped: ClassVar[Mapping[str, str | Mapping[Any, str]]] = {
        "attn_implementation": {
            "flash_attention_4": "flash-attn-4 (a pre-release on quack-kernels and the cutlass "
            "DSL); use flash_attention_2",
            "flash_attention_3": "flash-attn-3 (FlashAttention 3's Hopper build); use "
            "flash_attention_2",
        },
        "use_sonicmoe": "SonicMoE's expert kernels (quack-kernels >= 0.6.5 on "
        "nvidia-cutlass-dsl >= 4.7)",
        "nvfp4_merge_aware": "SonicMoE's merge-aware LoRA on NVFP4 experts (quack-kernels on "
        "nvidia-cutlass-dsl, and an NVFP4 checkpoint)",
        "autotune_cache_path": "the ScatterMoE expert kernels whose Triton autotune cache it "
        "seeds (the experts here run transformers' own forward)",
        "expert_parallel_backend": {
            "deep_ep": "DeepEP (built for the GPUs' architecture), the all-to-all dispatch it "
            "names",
        },
        **axolotl.NOT_SHIPPED,
    }
    # "stage" is a pipeline stage; the fine-tune's steps are its phases
    renamed: ClassVar[Mapping[str, str]] = {"stages": "train.phases"}
    foreign: ClassVar[Mapping[str, str]] = axolotl.FOREIGN

    lr: float = Field(1e-3, gt=0, le=1, description="peak learning rate")
    epochs: float | None = Field(
        None,
        gt=0,
        description="passes over the dataset (default 1); with phases, each phase gives its own "
        "and this one is refused",
    )
    max_steps: int = Field(-1, ge=-1, description="-1: as many as the epochs take")
    batch_size: PositiveInt = Field(8, description="packed rows per device per micro-step")
    grad_accum: PositiveInt = Field(1, description="micro-steps accumulated per optimizer step")
    max_length: int = Field(1024, ge=16, description="tokens per packed row")
    warmup_ratio: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of the steps the learning rate warms up over (below 1: transformers "
        "reads 1 or more as steps)",
    )
    lr_scheduler: Literal[
        "cosine", "linear", "constant", "constant_with_warmup", "cosine_with_min_lr"
    ] = Field("cosine", description="the learning-rate schedule (transformers' lr_scheduler_type)")
    weight_decay: float = Field(0.0, ge=0, description="the optimizer's weight decay")
    logging_steps: PositiveInt = Field(10, description="log the loss every N optimizer steps")
    method: Literal["full", "lora", "qlora"] = Field(
        "full", description="full-parameter SFT, or LoRA / QLoRA adapters merged into the base"
    )
    load_in_4bit: bool = Field(
        False,
        description="load the base in NF4 (method qlora only): bitsandbytes, nn.Linear layers "
        "only (fused experts stay bf16), as data-parallel replicas or under device_map",
    )
    quantize_moe_experts: bool = Field(
        False,
        description="with load_in_4bit: attention, dense MLP and the fused experts in NF4 "
        "(torchao), read layer by layer from the checkpoint by the staged loader and "
        "FSDP2-sharded over train.distributed's processes as each layer is read, or, with "
        "device_map, spread over the one process's GPUs as the map spreads layers",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="auto: float32 weights (bf16 compute on GPU); bf16 only for a frozen base",
    )
    attn_implementation: Attention = Field(
        "sdpa",
        description="sdpa (CPU), or flash_attention_2 (packed varlen on GPU); eager and "
        "flex_attention also load",
    )
    optim: Optimizer = Field(
        # transformers' own default: the fused kernel (numbers as before this key existed)
        "adamw_torch_fused",
        description="the optimizer (a transformers optim name); its package is checked when the "
        "job starts. adamw_torch_4bit / adamw_torch_8bit (torchao) only on one GPU: refused with "
        "FSDP2 or a device_map across GPUs (DDP replicas of bitsandbytes' QLoRA take them)",
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass: less memory, more compute"
    )
    chat_template: str | None = Field(
        None,
        description="a Jinja file (relative to the repository) with {% generation %} markers, to "
        "train with when the student's template has none and TRL has no training variant of it; "
        "the checkpoint keeps the student's own",
    )
    distributed: Distributed = Field(
        Distributed(), description="the fine-tune's processes: nodes, GPUs and sharding"
    )
    expert_parallel_backend: Literal["torch"] = Field(
        "torch",
        description="how distributed.expert_parallel_size moves tokens to their experts: torch "
        "(transformers' all-to-all over torch.distributed, NCCL or gloo)",
    )
    device_map: str | dict[str, Plain] | None = Field(
        None, description="model parallel in one process (e.g. auto)"
    )
    gpu_memory_limit: MemorySize | None = Field(
        None,
        description="max memory of each GPU for device_map (exclusive with max_memory): an int "
        "is GiB (as Axolotl reads it), a string has its unit (125GiB, 134GB; TiB, MiB, KiB, TB, "
        "MB, KB)",
    )
    max_memory: dict[Annotated[int | str, AfterValidator(_device)], MemorySize] | None = Field(
        None,
        description="max memory by GPU index (and 'cpu') for device_map, each as "
        "gpu_memory_limit: an int is GiB, a string has its unit",
    )
    sampled_options: dict[str, Annotated[list[Plain], Field(min_length=1)]] = Field(
        {}, description="model config attributes sampled per optimizer step from a list"
    )
    save_steps: int = Field(
        0, ge=0, description="checkpoint every N steps beside the output; a killed job resumes"
    )
    save_minutes: float = Field(
        30.0,
        ge=0,
        allow_inf_nan=False,
        description="also checkpoint once this many minutes of training have passed since the "
        "start or the last checkpoint (rank 0's clock, agreed by every rank), so a preempted job "
        "loses at most that; fractions allowed; 0: off. With save_steps, either one saves",
    )
    lora: Lora | None = Field(
        None,
        description="the adapter of method lora or qlora (required by them, refused with full)",
    )
    phases: list[TrainPhase] = Field(
        [],
        description="train in phases, each from the previous one's checkpoint and its own "
        "artifact (the last is the fine-tune); empty: one run on the whole dataset",
    )

    @model_validator(mode="after")
    def _method(self) -> Train:
        full = self.method == "full"
        problems = []
        if full and self.lora:
            problems.append("lora: is set but method is 'full' (a full fine-tune has no adapter)")
        if full and self.load_in_4bit:
            problems.append(
                "load_in_4bit: 4-bit weights cannot be fine-tuned directly "
                "(use method: qlora, or drop load_in_4bit)"
            )
        if self.method == "qlora" and not self.load_in_4bit:
            problems.append("load_in_4bit: method 'qlora' needs load_in_4bit: true")
        if self.method == "lora" and self.load_in_4bit:
            problems.append("method: LoRA on a 4-bit base is QLoRA; set method: qlora")
        if self.quantize_moe_experts and not self.load_in_4bit:
            problems.append(
                "quantize_moe_experts: needs method qlora with load_in_4bit: true (a full "
                "fine-tune drops all three)"
            )
        if self.quantize_moe_experts and self.device_map not in (None, "auto", "balanced"):
            problems.append(
                f"device_map: {self.device_map!r} with quantize_moe_experts: the staged NF4 loader "
                "places the layers itself, balanced over the GPUs as auto places them (within "
                "gpu_memory_limit / max_memory): give auto"
            )
        if not full and not self.lora:
            problems.append(
                f"lora: method '{self.method}' needs a lora section "
                "(r, alpha, target_modules / target_parameters)"
            )
        if self.dtype == "bfloat16" and full:
            problems.append(
                "dtype: bfloat16 with method full trains bf16 weights without a float32 master "
                "copy: updates below half a bf16 step (most, at lr 1e-5) are lost. Use dtype auto "
                "(float32 weights, bf16 compute on GPU)"
            )
        layouts = {"distributed": self.distributed}
        layouts.update(
            (f"phases.{i}.distributed", ph.distributed)
            for i, ph in enumerate(self.phases)
            if ph.distributed is not None
        )
        for key, d in layouts.items():
            if self.device_map is not None and (
                d.nodes != 1 or d.fsdp_size or d.dp_replicate_size != 1
            ):
                problems.append(
                    f"device_map: model parallel runs as one process on one node, spreading "
                    f"layers over gpus_per_node GPUs: set {key}.nodes 1 and no fsdp_size / "
                    "dp_replicate_size"
                )
            if (
                self.load_in_4bit
                and not self.quantize_moe_experts
                and self.device_map is None
                and d.nodes * d.gpus_per_node > 1
                and (d.fsdp_size or d.dp_replicate_size > 1)
            ):
                problems.append(
                    f"{key}: fsdp_size / dp_replicate_size with load_in_4bit: bitsandbytes' 4-bit "
                    "weights do not survive FSDP2 sharding, so its QLoRA processes are "
                    "data-parallel replicas. Set quantize_moe_experts: true (torchao NF4, "
                    "FSDP2-sharded by the staged loader), or use device_map"
                )
        if self.optim in ONE_DEVICE_OPTIMIZERS and self.device_map is not None:
            spread = [
                f"{key}.gpus_per_node {d.gpus_per_node}"
                for key, d in layouts.items()
                if d.gpus_per_node > 1
            ]
            if isinstance(self.device_map, dict):
                places = {str(v).removeprefix("cuda:") for v in self.device_map.values()}
                gpus = sorted(places - {"cpu", "disk", "meta"})
                if len(gpus) > 1:
                    spread.append(f"device_map onto {', '.join(gpus)}")
            if spread:
                problems.append(
                    f"optim: {self.optim} with a device_map across GPUs ({'; '.join(spread)}): "
                    f"{self.optim} fails once adapters span GPUs: use adamw_torch"
                )
        sharded = [
            f"{key}: {d.nodes * d.gpus_per_node} processes"
            for key, d in layouts.items()
            if d.nodes * d.gpus_per_node > 1
            and (not self.load_in_4bit or self.quantize_moe_experts)
        ]
        if self.optim in ONE_DEVICE_OPTIMIZERS and self.device_map is None and sharded:
            problems.append(
                f"optim: {self.optim} with FSDP2 ({'; '.join(sharded)}): torchao's low-bit "
                "AdamW runs on one GPU only; sharded, its compiled step fails once the other "
                "low-bit AdamW ran sharded on the node (torch's cache confuses their states). Use "
                "adamw_torch, or one process"
            )
        if self.gpu_memory_limit is not None and self.max_memory is not None:
            problems.append(
                "gpu_memory_limit: exclusive with max_memory (the limit sets max_memory for every "
                "GPU); give one of them"
            )
        if (self.gpu_memory_limit, self.max_memory) != (None, None) and self.device_map is None:
            problems.append(
                "gpu_memory_limit: gpu_memory_limit / max_memory only apply with device_map"
            )
        problems += self._device_map_problems(layouts)
        names = [ph.name for ph in self.phases]
        for i, name in enumerate(names):
            if name.endswith(ARTIFACT_SUFFIXES):
                problems.append(
                    f"phases.{i}.name: '{name}' ends like another file of a checkpoint "
                    f"({', '.join(ARTIFACT_SUFFIXES)}): ckpt/sft-{name} would be one; rename it"
                )
        if len(set(names)) != len(names):
            problems.append(f"phases: each phase name may be used once, got {names}")
        if self.phases and self.epochs is not None:
            problems.append(
                f"epochs: {self.epochs:g} would be overridden by train.phases, whose phases give "
                f"their own ({', '.join(f'{ph.name} {ph.epochs:g}' for ph in self.phases)}): "
                "drop train.epochs, or set train.phases: [] for one run of train.epochs over the "
                "whole dataset"
            )
        if problems:
            raise ValueError("\n".join(problems))
        if not self.phases and self.epochs is None:
            object.__setattr__(self, "epochs", 1.0)  # the default of a fine-tune in one phase
        return self

    def _device_map_problems(self, layouts: Mapping[str, Distributed]) -> list[str]:
        """The device map's strategy or devices, and the memory it may use on each GPU."""
        problems = []
        gpus = min(d.gpus_per_node for d in layouts.values())
        if isinstance(self.device_map, str) and self.device_map not in DEVICE_MAPS:
            problems.append(
                f"device_map: {self.device_map!r} is not a strategy ({', '.join(DEVICE_MAPS)}) "
                "and not a mapping of modules to devices"
            )
        for module, place in (
            (self.device_map or {}).items() if isinstance(self.device_map, dict) else []
        ):
            if not _MAP_DEVICE.fullmatch(str(place)) or isinstance(place, bool):
                problems.append(
                    f"device_map.{module}: {place!r} is not a device (a GPU index, cuda:N, cpu, "
                    "disk)"
                )
            elif (index := str(place).removeprefix("cuda:")).isdigit() and int(index) >= gpus:
                problems.append(
                    f"device_map.{module}: GPU {index} is not one of the {gpus} of gpus_per_node"
                )
        limits = {"gpu_memory_limit": self.gpu_memory_limit} if self.gpu_memory_limit else {}
        if self.max_memory is not None and not any(k != "cpu" for k in self.max_memory):
            problems.append(
                "max_memory: gives no GPU: the map would put every layer on the CPU or disk "
                "(give GPU indices, or drop max_memory)"
            )
        for device, size in (self.max_memory or {}).items():
            if device == "cpu":
                continue
            if int(device) >= gpus:
                problems.append(
                    f"max_memory.{device}: GPU {device} is not one of the {gpus} of gpus_per_node"
                )
            limits[f"max_memory.{device}"] = size
        for key, size in limits.items():
            if not MEMORY_RANGE[0] <= memory_bytes(size) <= MEMORY_RANGE[1]:
                problems.append(
                    f"{key}: {size!r} is not a GPU's memory (1MiB to 16TiB; an int is GiB)"
                )
        return problems

    @model_validator(mode="after")
    def _expert_parallel(self) -> Train:
        layouts = {"distributed": self.distributed}
        layouts.update(
            (f"phases.{i}.distributed", ph.distributed)
            for i, ph in enumerate(self.phases)
            if ph.distributed is not None
        )
        problems = []
        for key, d in layouts.items():
            ep = d.expert_parallel_size
            if ep == 1:
                continue
            if self.device_map is not None:
                problems.append(
                    f"{key}.expert_parallel_size: {ep} with device_map: expert parallelism splits "
                    "the experts over FSDP2 processes; a device map is one process"
                )
            if self.load_in_4bit and not self.quantize_moe_experts:
                problems.append(
                    f"{key}.expert_parallel_size: {ep} with load_in_4bit: bitsandbytes' 4-bit "
                    "base loads whole in each process. Set quantize_moe_experts: true (the "
                    "staged NF4 loader places each process's share of the experts)"
                )
            # the NF4 experts run their LoRA themselves (runtime/nf4.py), not through PEFT's
            if self.lora and self.lora.target_parameters and not self.quantize_moe_experts:
                problems.append(
                    f"{key}.expert_parallel_size: {ep} with lora.target_parameters "
                    f"{self.lora.target_parameters}: {EP_PARAMETER_LORA}"
                )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def phase_layout(self, phase: TrainPhase | None) -> Layout:
        """The processes of ``phase``'s job: its own distributed, else train.distributed."""
        if phase is None or phase.distributed is None:
            return self.layout
        return phase.distributed.layout(device_map=self.device_map is not None)

    @property
    def layout(self) -> Layout:
        return self.distributed.layout(device_map=self.device_map is not None)

    def max_memory_bytes(self, gpus: int) -> dict[int | str, int] | None:
        """from_pretrained's max_memory for the device map, in bytes: gpu_memory_limit on each of
        ``gpus`` GPUs, or max_memory's devices. Without GPUs there is nothing to limit: an empty
        max_memory would leave the map no device, and transformers then offloads to disk."""
        if self.gpu_memory_limit is not None:
            return {i: memory_bytes(self.gpu_memory_limit) for i in range(gpus)} or None
        if self.max_memory is not None:
            return {
                int(k) if str(k).isdigit() else k: memory_bytes(v)
                for k, v in self.max_memory.items()
            }
        return None

    @property
    def checkpointing(self) -> bool:
        """Whether the job writes preemption checkpoints (by steps, by time or both)."""
        return bool(self.save_steps or self.save_minutes)

    @property
    def expert_parallel(self) -> dict[str, int]:
        """Each layout that splits the experts (its key: distributed, phases.<i>.distributed), with
        its expert_parallel_size."""
        layouts = {"distributed": self.distributed}
        layouts.update(
            (f"phases.{i}.distributed", ph.distributed)
            for i, ph in enumerate(self.phases)
            if ph.distributed is not None
        )
        return {
            f"train.{k}": d.expert_parallel_size
            for k, d in layouts.items()
            if d.expert_parallel_size > 1
        }

    @property
    def sharded(self) -> bool:
        """FSDP2 shards full-precision models and torchao's NF4 ones (quantize_moe_experts).
        bitsandbytes' packed NF4 parameters do not survive the DTensor conversion (measured): its
        QLoRA processes are replicas."""
        return self.layout.world_size > 1 and (not self.load_in_4bit or self.quantize_moe_experts)


# TRL's loss types that work with token-level importance sampling (luspo needs sequence level).
LossType = Literal["dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "vespo"]


class Grpo(Section):
    """GRPO from the fine-tune on the pool's kernel problems; one reward, execution x rules."""

    group_size: int = Field(4, ge=2, description="completions per prompt (TRL num_generations)")
    prompts_per_step: PositiveInt = Field(
        2,
        description="problems per optimizer step, each answered group_size times; a multiple of "
        "the processes",
    )
    beta: float = Field(0.04, ge=0, description="KL coefficient")
    loss_type: LossType = Field(
        "dapo",
        description="TRL's GRPO loss_type: the objective and how its token losses are averaged",
    )
    lr: float = Field(1e-6, gt=0, description="learning rate")
    optim: Literal["adamw_torch", "sgd"] = Field(
        "adamw_torch",
        description="the optimizer (a transformers optim name). sgd moves a weight in proportion "
        "to its gradient; Adam moves every weight with any gradient by about lr, which on a tiny "
        "model turns reward noise into damage",
    )
    num_iterations: PositiveInt = Field(
        1, description="gradient steps on each generation batch (TRL num_iterations)"
    )
    sampling: Literal["uniform", "diversity"] = Field(
        "uniform",
        description="which problems a step trains on. uniform: TRL's shuffled passes. diversity: "
        "drawn with weight p(1-p), p the problem's success rate in its latest group (unseen: "
        "0.5), so steps go to problems whose groups disagree (a group all right or all wrong has "
        "no advantage to learn from); never below diversity_floor",
    )
    diversity_floor: float = Field(
        0.05, gt=0, le=0.25, description="least weight of a problem under diversity sampling"
    )
    max_grad_norm: float = Field(
        1.0,
        gt=0,
        description="gradients clipped to this norm before the step; with sgd the largest "
        "step is lr x max_grad_norm",
    )
    max_steps: PositiveInt = Field(100, description="optimizer steps")
    max_completion_length: PositiveInt = Field(1024, description="tokens per completion at most")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the completions")
    top_p: float = Field(
        1.0, gt=0, le=1, description="nucleus sampling of the completions (1: off)"
    )
    epsilon: float = Field(0.2, gt=0, description="the policy ratio's clipping range (TRL epsilon)")
    logging_steps: PositiveInt = Field(1, description="log every N optimizer steps")
    reward_workers: PositiveInt | None = Field(None, description="default: one per thread")
    max_harness_share: float = Field(
        0.25,
        ge=0,
        le=1,
        description="training stops when more than this share of a step's rewards are the "
        "validator's own failures (status harness): the model would learn from no reward",
    )
    dtype: Literal["auto", "float32"] = Field(
        "auto", description="auto: float32 weights, bf16 compute on GPU"
    )
    distributed: Distributed = Field(
        Distributed(), description="GRPO's processes: nodes, GPUs and sharding"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass: less memory, more compute"
    )

    @model_validator(mode="after")
    def _groups(self) -> Grpo:
        if self.distributed.expert_parallel_size > 1:
            raise ValueError(
                f"distributed.expert_parallel_size: {self.distributed.expert_parallel_size}: "
                "expert parallelism is wired for train only (GRPO's generation is not tested "
                "with it); drop the key"
            )
        world = self.layout.world_size
        if self.prompts_per_step % world:
            raise ValueError(
                f"prompts_per_step: {self.prompts_per_step} must be a multiple of the {world} "
                "processes of distributed (each takes whole groups)"
            )
        return self

    @property
    def layout(self) -> Layout:
        return self.distributed.layout()

    @property
    def checkpointing(self) -> bool:
        """Whether the job writes preemption checkpoints (by steps, by time or both)."""
        return bool(self.save_steps or self.save_minutes)

    @property
    def sharded(self) -> bool:
        return self.layout.world_size > 1


# A merge's share of the fine-tune: ratio x fine-tune + (1 - ratio) x base. 0 and 1 are the base
# and sft themselves, which every table compares already. The one bound of a merge ratio: the
# config and the merge job's params (stages/merge.py) both take this type.
MergeRatio = Annotated[float, Field(gt=0, lt=1)]


class Merge(Section):
    ratios: list[MergeRatio] = Field(
        [], description="each merge's ratio: ratio x fine-tune + (1 - ratio) x base"
    )
    select_on: str | None = Field(
        None,
        description="choose the ratio by accuracy on this benchmark, "
        "disjoint from every reported one",
    )
    select_by: Literal["accuracy", "tokens"] = Field(
        "accuracy",
        description="accuracy: the most accurate merge; tokens: the fewest mean tokens among the "
        "merges tied with the most accurate (paired bootstrap, the tables' resamples and "
        "confidence)",
    )

    @model_validator(mode="after")
    def _unique(self) -> Merge:
        if len(set(self.ratios)) != len(self.ratios):
            raise ValueError(f"ratios: each ratio may be listed once, got {self.ratios}")
        return self
