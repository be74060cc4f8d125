"""The base of every config section: unknown keys refused with the allowed ones (and a close match),
strict types, errors keyed by their place in the config, parsing that is idempotent."""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from decimal import Decimal

import pytest
import yaml
from pydantic import BaseModel

import stillroom
from stillroom.config import ConfigError, Section, Server, Train
from stillroom.config.base import _seed, unknown_keys
from stillroom.config.evaluation import parse_backend
from stillroom.stages.evaluate import Params as EvaluateParams
from stillroom.stages.generate import Params as GenerateParams


def test_unknown_keys_name_the_allowed_ones_and_a_close_match():
    assert unknown_keys(["lrr", "zzz"], ["lr", "epochs"]) == (
        "unknown key 'lrr' (did you mean 'lr'?), 'zzz'; allowed: epochs, lr"
    )


def test_errors_are_keyed_by_where_the_section_sits():
    with pytest.raises(ConfigError, match=r"grpo\.distributed: unknown key 'node'"):
        from stillroom.config import Grpo

        Grpo.parse({"distributed": {"node": 2}}, where="grpo")
    with pytest.raises(ConfigError, match=r"^invalid config:\n  max_length: Input should be"):
        Train.parse({"max_length": 3})


def test_union_tags_and_member_labels_are_not_keys_but_user_names_are():
    # A teacher named like a backend keeps its name; the backend's tag does not appear as a key.
    spec = {"backend": "openai", "model": "m", "base_url": "http://x/v1", "sampling": {"tempe": 1}}
    with pytest.raises(ConfigError) as err:
        GenerateParams.parse({"teacher": "openai", "spec": spec, "effort": "low", "samples": 1})
    assert "spec.sampling: unknown key 'tempe'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_backend({"backend": "openai", "base_url": 3})
    assert "eval.backend.base_url: Input should be a valid string (got 3)" in str(err.value)


def test_parsing_is_strict_idempotent_and_dumps_every_default():
    with pytest.raises(ConfigError, match="train.batch_size: Input should be a valid integer"):
        Train.parse({"batch_size": "8"}, where="train")
    with pytest.raises(ConfigError, match="train.batch_size: Input should be a valid integer"):
        Train.parse({"batch_size": True}, where="train")
    train = Train.parse({"lr": 0.01})
    assert Train.parse(train) is train
    dumped = train.dump()
    assert dumped["lr"] == 0.01 and dumped["max_length"] == 1024 and dumped["lora"] is None
    assert Train.parse(dumped) == train


def _every_model() -> list[type[BaseModel]]:
    """Every pydantic model of the package: the config sections and each stage's params."""
    for module in pkgutil.walk_packages(stillroom.__path__, "stillroom."):
        if module.name.startswith(("stillroom.config", "stillroom.stages", "stillroom.grading")):
            importlib.import_module(module.name)

    def below(cls: type) -> list[type]:
        return [sub for c in cls.__subclasses__() for sub in (c, *below(c))]

    return [m for m in below(BaseModel) if m.__module__.startswith("stillroom.")]


def test_every_model_is_a_section_refusing_inf_and_nan_and_every_seed_is_a_seed():
    models = _every_model()
    assert len(models) > 40
    for model in models:
        assert issubclass(model, Section), model
        assert model.model_config.get("allow_inf_nan") is False, model
        seed = model.model_fields.get("seed")
        if seed is not None:
            assert any(getattr(m, "func", None) is _seed for m in seed.metadata), model
    assert sum("seed" in m.model_fields for m in models) >= 15


def test_a_stage_refuses_a_seed_numpy_or_torch_would_and_a_non_finite_float():
    spec = {"backend": "procedural"}
    ok = {"teacher": "t", "spec": spec, "effort": "low", "samples": 1}
    assert GenerateParams.parse({**ok, "seed": 2**32 - 1}).seed == 2**32 - 1
    for seed in (2**32, 2**64, -1):
        with pytest.raises(
            ConfigError,
            match=rf"^invalid config:\n  seed: a seed is 0 <= seed < "
            rf"2\*\*32 = 4294967296, .* \(got {seed}\)$",
        ):
            GenerateParams.parse({**ok, "seed": seed})
    with pytest.raises(ConfigError, match=r"spec.error_rate.low: Input should be a finite number"):
        GenerateParams.parse({**ok, "spec": {**spec, "error_rate": {"low": math.nan}}})
    params = {"model_name": "sft", "benchmark": "b", "effort_tag": "$effort", "max_new_tokens": 8}
    params |= {"top_p": 1.0, "batch_size": 1, "samples": 1}
    with pytest.raises(
        ConfigError,
        match=r"^invalid config:\n  temperature: Input should be a "
        r"finite number \(got inf\)$",
    ):
        EvaluateParams.parse({**params, "temperature": math.inf})


def test_untyped_values_refuse_inf_and_nan_anywhere_inside():
    server = {"command": "x --port {port} --scale {scale}", "scale": math.inf}
    with pytest.raises(ConfigError, match=r"server.scale: Input should be a finite number"):
        Server.parse(server, where="server")
    assert Server.parse({**server, "scale": 2.5}).model_extra == {"scale": 2.5}
    with pytest.raises(ConfigError, match=r"train.sampled_options.x.1: Input should be a finite"):
        Train.parse({"sampled_options": {"x": [1.0, -math.inf]}}, where="train")


@pytest.mark.parametrize(
    ("expected", "given", "hint"),
    [
        ("float", "3e-3", "YAML reads 3e-3 as a string; write 3.0e-3"),
        ("float", "1E6", "YAML reads 1E6 as a string; write 1.0e+6"),
        ("float", "-2.5e5", "YAML reads -2.5e5 as a string; write -2.5e+5"),
        ("float", "5e+2", "YAML reads 5e+2 as a string; write 5.0e+2"),
        ("int", "1e3", "YAML reads 1e3 as a string; write 1000"),
        ("int", "2.5e1", "YAML reads 2.5e1 as a string; write 25"),
        ("int", "1e30", f"YAML reads 1e30 as a string; write 1{'0' * 30}"),
        ("int", "8", "a string, as quoted; write 8 without quotes"),
        ("float", "0.5", "a string, as quoted; write 0.5 without quotes"),
        ("int", "8.0", "YAML reads 8.0 as a string; write 8"),
        ("int", "1e-3", None),  # not a whole number: no spelling would do
        ("float", "fast", None),
        ("float", "inf", None),  # Python reads it, but it is refused as a number too
        ("float", "1e400", None),
    ],
)
def test_a_number_yaml_read_as_a_string_is_spelled_as_yaml_reads_it(expected, given, hint):
    key = "max_steps" if expected == "int" else "lr"
    with pytest.raises(ConfigError) as err:
        Train.parse({key: given}, where="train")
    message = str(err.value)
    assert f"train.{key}: Input should be a valid " in message and f"(got '{given}')" in message
    if hint is None:
        assert "YAML" not in message, message
    else:
        assert message.endswith(f"(got '{given}'): {hint}"), message
        spelling = re.search(r"write (\S+)", hint)[1]
        read = yaml.safe_load(spelling)  # YAML reads the spelling as the number meant
        assert type(read).__name__ == expected and Decimal(str(read)) == Decimal(given)
