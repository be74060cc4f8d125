"""The base of every config section: unknown keys refused with the allowed ones (and a close match),
strict types, errors keyed by their place in the config, parsing that is idempotent."""

from __future__ import annotations

import pytest

from stillroom.config import ConfigError, Train
from stillroom.config.base import unknown_keys
from stillroom.config.evaluation import parse_backend
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
