"""The training sections: LoRA / QLoRA settings and the process layout are checked before anything
loads, each failure naming its key; a layout is FSDP2 x replicas over nodes x GPUs, or one
device-map process."""

import re
import typing
from pathlib import Path

import pytest

from stillroom.config import ConfigError, Grpo, Train, load_yaml, resolve
from stillroom.config.training import ONE_DEVICE_OPTIMIZERS, OPTIMIZERS, Attention

REPO = Path(__file__).resolve().parents[2]
LORA = {
    "r": 4,
    "alpha": 8,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
}

QLORA = {"method": "qlora", "lora": LORA, "load_in_4bit": True}


def test_only_torchao_nf4_is_sharded_by_fsdp2():
    """bitsandbytes' QLoRA processes are replicas; with quantize_moe_experts the staged NF4 model
    is FSDP2-sharded like a full-precision one, HSDP included."""
    node = {"distributed": {"gpus_per_node": 8}}
    assert not Train.parse({**QLORA, **node}).sharded
    staged = {**QLORA, "quantize_moe_experts": True}
    assert Train.parse({**staged, **node}).sharded and not Train.parse(staged).sharded
    hsdp = Train.parse(
        {**staged, "distributed": {"nodes": 2, "gpus_per_node": 8, "dp_replicate_size": 2}}
    )
    assert hsdp.sharded and (hsdp.layout.fsdp_size, hsdp.layout.dp_replicate_size) == (8, 2)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"method": "full", "lora": LORA}, "train.lora: .*a full fine-tune has no adapter"),
        ({"method": "lora"}, "train.lora: method 'lora' needs a lora section"),
        (
            {"method": "dora", "lora": LORA},
            "train.method: Input should be 'full', 'lora' or 'qlora'",
        ),
        (
            {"method": "qlora", "lora": LORA},
            "train.load_in_4bit: method 'qlora' needs load_in_4bit",
        ),
        ({"method": "lora", "lora": LORA, "load_in_4bit": True}, "set method: qlora"),
        ({"method": "full", "load_in_4bit": True}, "4-bit weights cannot be fine-tuned directly"),
        (
            {"method": "qlora", "lora": LORA, "load_in_4bit": "yes"},
            "train.load_in_4bit: Input should be a valid boolean",
        ),
        (
            {"method": "lora", "lora": {**LORA, "dropout": 0.1}},
            "train.lora.dropout: must be 0 with target_parameters",
        ),
        (
            {"method": "lora", "lora": {**LORA, "target_modules": ["q_proj", "mlp.gate"]}},
            "train.lora.target_modules: mlp.gate is the router",
        ),
        ({"method": "lora", "lora": {**LORA, "rank": 8}}, "train.lora: unknown key 'rank'"),
        (
            {"method": "lora", "lora": LORA, "quantize_moe_experts": True},
            "train.quantize_moe_experts: needs method qlora with load_in_4bit: true",
        ),
        (
            {**QLORA, "distributed": {"gpus_per_node": 8, "fsdp_size": 8}},
            "train.distributed: .* do not survive FSDP2 sharding.* Set quantize_moe_experts: true",
        ),
    ],
)
def test_lora_config_fails_before_loading(params, message):
    with pytest.raises(ConfigError, match=message):
        Train.parse(params, where="train")


@pytest.mark.parametrize(
    "params, message",
    [
        (
            {"distributed": {"nodes": 1, "gpus_per_node": 4, "fsdp_size": 3}},
            "train.distributed.fsdp_size: .* must equal the world size 4",
        ),
        (
            {"distributed": {"nodes": 2, "gpus_per_node": 4, "dp_replicate_size": 3}},
            "train.distributed.dp_replicate_size: 3 does not divide the world size 8",
        ),
        ({"distributed": {"gpus": 8}}, "train.distributed: unknown key 'gpus'"),
        (
            {"distributed": {"nodes": 0}},
            "train.distributed.nodes: Input should be greater than or equal to 1",
        ),
        (
            {"device_map": "auto", "gpu_memory_limit": "70GiB", "max_memory": {"0": "70GiB"}},
            "train.gpu_memory_limit: exclusive with max_memory",
        ),
        ({"gpu_memory_limit": "70GiB"}, "only apply with device_map"),
        (
            {"device_map": "auto", "distributed": {"nodes": 2, "gpus_per_node": 8}},
            "train.device_map: model parallel runs as one process on one node",
        ),
        (
            {
                "device_map": "auto",
                "phases": [{"name": "a", "epochs": 1, "distributed": {"nodes": 2}}],
            },
            "train.device_map: .*set phases.0.distributed.nodes 1",
        ),
        (
            {"phases": [{"name": "a", "epochs": 1, "distributed": {"gpus": 8}}]},
            "train.phases.0.distributed: unknown key 'gpus'",
        ),
        # an overlay's epochs under inherited phases would be ignored: both keys named
        (
            {
                "epochs": 1,
                "phases": [{"name": "medium", "epochs": 2}, {"name": "all", "epochs": 1}],
            },
            r"train.epochs: 1 would be overridden by train.phases, whose phases give their own "
            r"\(medium 2, all 1\)",
        ),
    ],
)
def test_layout_checks_name_the_key(params, message):
    with pytest.raises(ConfigError, match=message):
        Train.parse(params, where="train")


def test_layout_defaults_and_hsdp():
    assert Train.parse({}).layout.world_size == 1
    d = Train.parse(
        {"distributed": {"nodes": 2, "gpus_per_node": 8, "dp_replicate_size": 2}}
    ).layout
    assert (d.world_size, d.fsdp_size, d.dp_replicate_size) == (16, 8, 2)


def test_device_map_is_one_process_over_the_nodes_gpus():
    d = Train.parse(
        {"device_map": "auto", "gpu_memory_limit": "125GiB", "distributed": {"gpus_per_node": 8}}
    ).layout
    assert (d.world_size, d.gpus_per_node, d.nodes) == (1, 8, 1)


def test_epochs_default_to_one_pass_without_phases_and_each_phase_may_have_its_own_layout():
    assert Train.parse({}).epochs == 1.0 and Train.parse({"epochs": 3}).epochs == 3
    train = Train.parse(
        {
            "distributed": {"gpus_per_node": 4},
            "phases": [
                {"name": "medium", "epochs": 2},
                {"name": "efforts", "epochs": 1, "distributed": {"gpus_per_node": 8}},
            ],
        }
    )
    assert train.epochs is None  # a phased fine-tune's passes are its phases'
    assert [train.phase_layout(ph).world_size for ph in train.phases] == [4, 8]
    assert train.phase_layout(None).world_size == 4
    # the resolved config parses again (its dump carries no epochs beside the phases)
    assert Train.parse(train.dump()) == train


@pytest.mark.parametrize(
    "kind, target",
    [
        ("target_modules", "mlp.gate"),
        ("target_modules", "gate"),
        ("target_modules", "router"),
        ("target_modules", "mlp.router"),
        ("target_modules", "block_sparse_moe.router.layer"),
        ("target_parameters", "gate.weight"),
        ("target_parameters", "mlp.gate.weight"),
        ("target_parameters", "model.layers.3.mlp.router.weight"),
        ("target_parameters", "mlp.gate.e_score_correction_bias"),
        # Qwen2-MoE's and Qwen3-Next's shared expert gate, as Axolotl's qwen3-next example targets
        # it (examples/qwen3-next/qwen3-next-80b-a3b-qlora.yaml, axolotl-ai-cloud/axolotl
        # 067b021c8b87a9e5e380b9173c704cf7340e30f5)
        ("target_modules", "shared_expert_gate"),
        ("target_modules", "mlp.shared_expert_gate"),
        ("target_parameters", "shared_expert_gate.weight"),
        ("target_modules", r"model.layers.\d+.mlp.shared_expert_gate"),
        ("target_modules", r".*\.mlp\.shared_expert_gate"),
    ],
)
def test_every_spelling_of_the_router_is_refused_unless_allowed(kind, target):
    lora = {**LORA, kind: [*LORA[kind], target]}
    role = "the shared expert's gate" if "shared" in target else "the router"
    with pytest.raises(
        ConfigError,
        match=rf"train.lora.{kind}: {re.escape(target)} is {role}; .*Set allow_router: true",
    ):
        Train.parse({"method": "lora", "lora": lora}, where="train")
    assert Train.parse({"method": "lora", "lora": {**lora, "allow_router": True}}).lora


def test_gate_projections_are_not_the_router():
    lora = {
        **LORA,
        "target_modules": [
            "gate_proj",
            "up_proj",
            "mlp.gate_proj",
            "shared_expert.gate_proj",
            "shared_expert.up_proj",
        ],
        "target_parameters": ["gate_up_proj", "mlp.experts.gate_up_proj", "experts.down_proj"],
    }
    assert Train.parse({"method": "lora", "lora": lora}).lora.target_parameters[0] == "gate_up_proj"


def test_optim_names_are_transformers_own_with_their_packages():
    from transformers import trainer_optimizer
    from transformers.training_args import OptimizerNames

    names = {o.value for o in OptimizerNames}
    # every name train takes is transformers'; those left out need optim_target_modules
    assert set(OPTIMIZERS) <= names
    assert all(n.startswith(("galore_", "apollo_")) for n in names - set(OPTIMIZERS))
    for group, module in (
        (trainer_optimizer._BITSANDBYTES_OPTIMIZERS, "bitsandbytes"),
        (trainer_optimizer._TORCHAO_OPTIMIZERS, "torchao"),
        (trainer_optimizer._SCHEDULE_FREE_OPTIMIZERS, "schedulefree"),
    ):
        assert {OPTIMIZERS[o.value][0] for o in group} == {module}
    assert set(ONE_DEVICE_OPTIMIZERS) == {o.value for o in trainer_optimizer._TORCHAO_OPTIMIZERS}
    assert Train.parse({}).optim == "adamw_torch_fused"  # transformers' default
    assert Train.parse({"optim": "sgd"}).optim == "sgd"
    with pytest.raises(ConfigError, match=r"train.optim: Input should be 'adamw_torch', .*'adamw"):
        Train.parse({"optim": "adam"}, where="train")


MP = {"device_map": "auto", "gpu_memory_limit": "125GiB", "distributed": {"gpus_per_node": 8}}


@pytest.mark.parametrize("optim", ONE_DEVICE_OPTIMIZERS)
@pytest.mark.parametrize(
    "layout, where",
    [
        (MP, r"distributed.gpus_per_node 8"),
        (
            {
                "device_map": "auto",
                "phases": [{"name": "a", "epochs": 1, "distributed": {"gpus_per_node": 2}}],
            },
            r"phases.0.distributed.gpus_per_node 2",
        ),
        (
            {"device_map": {"model.embed_tokens": 0, "model.layers": 1, "lm_head": "cpu"}},
            r"device_map onto 0, 1",
        ),
    ],
)
def test_a_low_bit_adamw_is_refused_once_a_device_map_spans_gpus(optim, layout, where):
    with pytest.raises(
        ConfigError,
        match=rf"train.optim: {optim} with a device_map across GPUs \({where}\): {optim} fails "
        "once adapters span GPUs: use adamw_torch",
    ):
        Train.parse({**layout, "optim": optim}, where="train")


@pytest.mark.parametrize("optim", ONE_DEVICE_OPTIMIZERS)
@pytest.mark.parametrize(
    "layout, where",
    [
        ({"distributed": {"gpus_per_node": 8}}, r"distributed: 8 processes"),
        (
            {**QLORA, "quantize_moe_experts": True, "distributed": {"nodes": 2}},
            r"distributed: 2 processes",
        ),
        (
            {"phases": [{"name": "a", "epochs": 1, "distributed": {"gpus_per_node": 2}}]},
            r"phases.0.distributed: 2 processes",
        ),
    ],
)
def test_a_low_bit_adamw_is_refused_with_fsdp2(optim, layout, where):
    """The field says "only on one GPU": FSDP2-sharded processes (full precision, or torchao's NF4
    through the staged loader) are refused too, naming the layout."""
    with pytest.raises(
        ConfigError,
        match=rf"train.optim: {optim} with FSDP2 \({where}\): torchao's low-bit AdamW runs on one "
        r"GPU only; .*Use adamw_torch, or one process",
    ):
        Train.parse({**layout, "optim": optim}, where="train")


def test_a_low_bit_adamw_on_one_gpu_and_bitsandbytes_across_gpus_are_accepted():
    assert Train.parse({"device_map": "auto", "optim": "adamw_torch_4bit"}).optim
    assert Train.parse({"optim": "adamw_torch_8bit"}).optim
    # bitsandbytes' QLoRA processes are DDP replicas, each holding plain tensors and its own state
    replicas = Train.parse(
        {**QLORA, "distributed": {"gpus_per_node": 8}, "optim": "adamw_torch_4bit"}
    )
    assert not replicas.sharded and replicas.layout.world_size == 8
    # bitsandbytes keeps each parameter's state on that parameter's device
    assert Train.parse({"distributed": {"gpus_per_node": 8}, "optim": "adamw_8bit"}).optim
    assert Train.parse({**MP, "optim": "paged_adamw_8bit"}).optim == "paged_adamw_8bit"
    assert Train.parse({**MP, "optim": "adamw_torch"}).optim == "adamw_torch"


@pytest.mark.parametrize(
    "key, value, missing",
    [
        ("attn_implementation", "flash_attention_4", r"flash-attn-4 .*use flash_attention_2"),
        ("attn_implementation", "flash_attention_3", r"flash-attn-3 .*use flash_attention_2"),
        ("use_sonicmoe", True, r"quack-kernels >= 0.6.5 on nvidia-cutlass-dsl"),
        ("nvfp4_merge_aware", True, r"quack-kernels on nvidia-cutlass-dsl"),
        ("autotune_cache_path", "autotune/b200.json", r"ScatterMoE expert kernels"),
        ("expert_parallel_backend", "deep_ep", r"DeepEP"),
    ],
)
def test_keys_of_a_gpu_stack_not_shipped_name_what_is_missing(key, value, missing):
    with pytest.raises(ConfigError) as err:
        Train.parse({key: value, "lr": 1e-4}, where="train")
    line = str(err.value).splitlines()[1].strip()
    assert re.match(rf"train.{key}: .*this repository does not ship .*{missing}", line), line
    assert "unknown key" not in str(err.value)


def test_attention_is_one_transformers_accepts_and_unshipped_keys_go_with_unknown_ones():
    from transformers.modeling_utils import AttentionInterface

    accepted = set(typing.get_args(Attention))
    assert accepted <= {"eager", *AttentionInterface._global_mapping}
    assert Train.parse({"attn_implementation": "flex_attention"}).attn_implementation
    with pytest.raises(ConfigError, match=r"train.attn_implementation: Input should be 'sdpa'"):
        Train.parse({"attn_implementation": "flash"}, where="train")
    with pytest.raises(ConfigError) as err:
        Train.parse({"use_sonicmoe": True, "optimiser": "sgd"}, where="train")
    lines = str(err.value).splitlines()
    assert lines[1].strip().startswith("train.use_sonicmoe: this repository does not ship")
    assert "unknown key 'optimiser' (did you mean 'optim'?)" in lines[2]


def test_expert_parallelism_splits_each_fsdp_group_and_keeps_the_world_size():
    d = Train.parse(
        {
            "distributed": {"nodes": 2, "gpus_per_node": 8, "expert_parallel_size": 8},
            "expert_parallel_backend": "torch",
        }
    ).layout
    assert (d.world_size, d.fsdp_size, d.expert_parallel_size) == (16, 16, 8)
    assert Train.parse({}).layout.expert_parallel_size == 1
    assert Train.parse({}).expert_parallel_backend == "torch"


@pytest.mark.parametrize(
    "params, message",
    [
        (
            {"distributed": {"gpus_per_node": 4, "expert_parallel_size": 3}},
            r"train.distributed.expert_parallel_size: 3 does not divide fsdp_size 4",
        ),
        (
            {
                "distributed": {
                    "nodes": 2,
                    "gpus_per_node": 4,
                    "dp_replicate_size": 2,
                    "expert_parallel_size": 8,
                }
            },
            r"expert_parallel_size: 8 does not divide fsdp_size 4 .*world size 8",
        ),
        (
            {"distributed": {"expert_parallel_size": 2}},
            r"expert_parallel_size: 2 does not divide fsdp_size 1",
        ),
        (
            {"device_map": "auto", "distributed": {"gpus_per_node": 2, "expert_parallel_size": 2}},
            r"train.distributed.expert_parallel_size: 2 with device_map: .* is one process",
        ),
        (
            {
                "method": "lora",
                "lora": LORA,
                "distributed": {"gpus_per_node": 2, "expert_parallel_size": 2},
            },
            r"train.distributed.expert_parallel_size: 2 with lora.target_parameters \[.*\]: "
            r".*got mixed torch.Tensor and DTensor.*put LoRA on target_modules only",
        ),
        (
            {
                "method": "qlora",
                "load_in_4bit": True,
                "lora": {**LORA, "target_parameters": []},
                "phases": [
                    {
                        "name": "a",
                        "epochs": 1,
                        "distributed": {"gpus_per_node": 2, "expert_parallel_size": 2},
                    }
                ],
            },
            r"phases.0.distributed.expert_parallel_size: 2 with load_in_4bit: .*Set "
            r"quantize_moe_experts: true",
        ),
        ({"expert_parallel_backend": "nccl"}, r"train.expert_parallel_backend: Input should be"),
    ],
)
def test_expert_parallelism_is_refused_where_it_cannot_run(params, message):
    with pytest.raises(ConfigError, match=message):
        Train.parse(params, where="train")


def test_nf4_experts_take_expert_parallelism_with_lora_on_the_experts():
    """The staged NF4 loader places each rank's experts and runs their LoRA itself, so neither
    refusal of transformers' bf16 expert parallelism applies to it."""
    train = Train.parse(
        {
            **QLORA,
            "quantize_moe_experts": True,
            "distributed": {"gpus_per_node": 8, "expert_parallel_size": 8},
        }
    )
    assert train.sharded and train.lora.target_parameters
    assert (train.layout.fsdp_size, train.layout.expert_parallel_size) == (8, 8)


def test_grpo_refuses_expert_parallelism():
    with pytest.raises(ConfigError, match=r"expert parallelism is wired for train only"):
        Grpo.parse({"distributed": {"gpus_per_node": 2, "expert_parallel_size": 2}}, where="grpo")


def test_save_minutes_checkpoints_by_time_by_default_and_must_be_a_finite_interval():
    """A job without save_steps still checkpoints every 30 minutes of training; 0 turns it off;
    an interval that could never come (inf, nan) or a negative one is refused, naming the key."""
    default = Train.parse({})
    assert default.save_minutes == 30 and default.save_steps == 0 and default.checkpointing
    assert Train.parse({"save_minutes": 0.001}).save_minutes == 0.001  # fractions are allowed
    assert not Train.parse({"save_minutes": 0}).checkpointing
    assert Train.parse({"save_minutes": 0, "save_steps": 5}).checkpointing
    for value, message in (
        (float("inf"), "Input should be a finite number"),
        (float("nan"), "Input should be a finite number"),
        (-1, "Input should be greater than or equal to 0"),
    ):
        with pytest.raises(ConfigError, match=rf"train\.save_minutes: {message}"):
            Train.parse({"save_minutes": value}, where="train")


def test_train_stages_is_refused_naming_its_new_key_in_one_line(tmp_path):
    """train.phases was train.stages (a pipeline stage is another thing): an old recipe fails on
    that one line, whatever else it sets, and the same entries under the new key run."""
    recipe = REPO / "config" / "experiments" / "beam-distill.yaml"
    old = recipe.read_text().replace("\n  phases:", "\n  stages:")
    assert old != recipe.read_text()
    (tmp_path / "old.yaml").write_text(old)
    config = load_yaml(tmp_path / "old.yaml")
    with pytest.raises(ConfigError) as err:
        resolve(config, REPO)
    line = "train.stages: renamed train.phases (same entries)"
    assert [m.strip() for m in str(err.value).splitlines()[1:]] == [line]
    config["train"]["phases"] = config["train"].pop("stages")
    assert [ph["name"] for ph in resolve(config, REPO)["train"]["phases"]] == ["medium", "efforts"]


# Axolotl reads an int gpu_memory_limit as GiB: str(limit) + "GiB" (axolotl-ai-cloud/axolotl,
# src/axolotl/loaders/model.py, commit 067b021c8b87a9e5e380b9173c704cf7340e30f5).
@pytest.mark.parametrize(
    "limit, nbytes",
    [
        (125, 125 * 2**30),
        ("125GiB", 125 * 2**30),
        ("80GB", 80 * 10**9),
        ("1.5TiB", int(1.5 * 2**40)),
        ("512 MiB", 512 * 2**20),
    ],
)
def test_gpu_memory_limit_takes_axolotls_units(limit, nbytes):
    """An int is GiB (transformers alone would read 125 as 125 bytes per GPU); a string keeps its
    unit. What the device map gets is bytes on each GPU."""
    train = Train.parse({**MP, "gpu_memory_limit": limit})
    assert train.max_memory_bytes(8) == dict.fromkeys(range(8), nbytes)
    assert train.max_memory_bytes(0) is None  # no GPU: nothing to limit
    description = Train.model_fields["gpu_memory_limit"].description
    assert "an int is GiB" in description and "a string has its unit" in description


def test_accelerate_reads_the_strings_as_train_does_and_an_int_as_bytes():
    """The strings train takes mean to accelerate (which reads max_memory for transformers) what
    they mean here; a bare int is bytes to it, hence the conversion before it is passed on."""
    from accelerate.utils import convert_file_size_to_int

    for text in ("125GiB", "80GB", "512MiB", "3000KB"):
        train = Train.parse({**MP, "gpu_memory_limit": text})
        assert train.max_memory_bytes(1) == {0: convert_file_size_to_int(text)}
    assert convert_file_size_to_int(125) == 125
    assert convert_file_size_to_int("80gb") == 10**10  # a lower-case b is bits: refused here


@pytest.mark.parametrize(
    "params, message",
    [
        ({"gpu_memory_limit": "lots"}, r"train.gpu_memory_limit: a memory size is an int of GiB "),
        ({"gpu_memory_limit": "125XB"}, r"train.gpu_memory_limit: .*got '125XB'"),
        ({"gpu_memory_limit": "80gb"}, r"train.gpu_memory_limit: .*got '80gb'"),
        ({"gpu_memory_limit": -1}, r"train.gpu_memory_limit: a memory size is more than 0 bytes"),
        ({"gpu_memory_limit": 0}, r"train.gpu_memory_limit: a memory size is more than 0 bytes"),
        ({"gpu_memory_limit": 12.5}, r"train.gpu_memory_limit: Input should be a valid integer"),
        ({"max_memory": {0: "lots"}}, r"train.max_memory.0: a memory size is an int of GiB"),
        ({"max_memory": {0: 0}}, r"train.max_memory.0: a memory size is more than 0 bytes"),
        ({"max_memory": {"gpu0": "8GiB"}}, r"train.max_memory: key 'gpu0': a device of "),
        ({"max_memory": {-1: "8GiB"}}, r"train.max_memory: key '-1': .*GPU index .* or 'cpu'"),
    ],
)
def test_a_memory_size_without_a_meaning_is_refused_naming_the_key(params, message):
    with pytest.raises(ConfigError, match=message):
        Train.parse({"device_map": "auto", **params}, where="train")


def test_max_memory_takes_gpu_indices_and_cpu_each_in_the_same_units():
    train = Train.parse(
        {
            "device_map": "auto",
            "distributed": {"gpus_per_node": 2},
            "max_memory": {0: 70, "1": "60GiB", "cpu": "1TiB"},
        }
    )
    assert train.max_memory_bytes(0) == {0: 70 * 2**30, 1: 60 * 2**30, "cpu": 2**40}
    # the dump's keys are strings ("0"), the same devices
    assert Train.parse(train.dump()).max_memory_bytes(0) == train.max_memory_bytes(0)
