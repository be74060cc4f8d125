"""The training sections: LoRA / QLoRA settings and the process layout are checked before anything
loads, each failure naming its key; a layout is FSDP2 x replicas over nodes x GPUs, or one
device-map process."""

import pytest

from stillroom.config import ConfigError, Train

LORA = {
    "r": 4,
    "alpha": 8,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
}


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
                "stages": [{"name": "a", "epochs": 1, "distributed": {"nodes": 2}}],
            },
            "train.device_map: .*set stages.0.distributed.nodes 1",
        ),
        (
            {"stages": [{"name": "a", "epochs": 1, "distributed": {"gpus": 8}}]},
            "train.stages.0.distributed: unknown key 'gpus'",
        ),
        # an overlay's epochs under inherited stages would be ignored: both keys named
        (
            {
                "epochs": 1,
                "stages": [{"name": "medium", "epochs": 2}, {"name": "all", "epochs": 1}],
            },
            r"train.epochs: 1 would be overridden by train.stages, whose stages give their own "
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


def test_epochs_default_to_one_pass_without_stages_and_each_stage_may_have_its_own_layout():
    assert Train.parse({}).epochs == 1.0 and Train.parse({"epochs": 3}).epochs == 3
    train = Train.parse(
        {
            "distributed": {"gpus_per_node": 4},
            "stages": [
                {"name": "medium", "epochs": 2},
                {"name": "efforts", "epochs": 1, "distributed": {"gpus_per_node": 8}},
            ],
        }
    )
    assert train.epochs is None  # a staged fine-tune's passes are its stages'
    assert [train.stage_layout(st).world_size for st in train.stages] == [4, 8]
    assert train.stage_layout(None).world_size == 4
    # the resolved config parses again (its dump carries no epochs beside the stages)
    assert Train.parse(train.dump()) == train
