"""Saved checkpoints are the same bytes whatever the environment and the checkout's path
(runtime/saving.py): transformers 5 records how a tokenizer was loaded (``local_files_only``, set
by HF_HUB_OFFLINE, which `make run` exports and a plain `snakemake` does not)."""

import json
import re
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest

from stillroom.runtime.saving import LOADING_KEYS, make_portable, portable_config
from stillroom.runtime.student import build_model, train_tokenizer

from ..conftest import REPO, TINY


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_a_checkpoint_is_the_same_bytes_offline_or_not_and_from_any_path(tmp_path, monkeypatch):
    texts = ["What is 1 + 2? The answer is 3.", "hello world, again and again"] * 40
    first = tmp_path / "one" / "tok"
    train_tokenizer(texts, first, vocab_size=300, min_frequency=1)
    second = tmp_path / "two" / "deeper" / "tok"
    shutil.copytree(first, second)
    built = {}
    # what HF_HUB_OFFLINE=1 sets when huggingface_hub is imported, and a plain environment
    for offline, tok_dir in ((True, first), (False, second)):
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
        out = tok_dir.parent / "base"
        build_model(tok_dir.resolve(), out, model=TINY, seed=0)
        built[offline] = files(out)
    assert built[True] == built[False]
    config = json.loads(built[True]["tokenizer_config.json"])
    assert not LOADING_KEYS & config.keys()
    assert config["eos_token"] == "<|im_end|>"  # what the tokenizer is stays
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= built[True].keys()


def test_loading_options_and_absolute_file_paths_are_dropped():
    saved = {
        "local_files_only": True,
        "is_local": True,
        "cache_dir": "/home/someone/.cache/huggingface",
        "token": "hf_secret",
        "vocab_file": "/home/someone/.cache/huggingface/hub/vocab.json",
        "model_max_length": 2048,
        "eos_token": "<|im_end|>",
        "chat_template_file": "template.jinja",  # relative: what the checkpoint holds
    }
    assert portable_config("tokenizer_config.json", saved) == {
        "model_max_length": 2048,
        "eos_token": "<|im_end|>",
        "chat_template_file": "template.jinja",
    }


def test_an_adapter_records_its_base_relative_to_the_job_directory(tmp_path, monkeypatch):
    """PEFT's adapter_config.json names the base as it was loaded; an absolute path under the
    job's directory becomes relative (the adapter merge, run in the same directory, still checks
    it); LoraConfig's own fields, ``revision`` among them, stay."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "x" / "ckpt" / "base").mkdir(parents=True)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    config = {
        "base_model_name_or_path": str(tmp_path / "results" / "x" / "ckpt" / "base"),
        "peft_type": "LORA",
        "revision": None,
        "r": 8,
    }
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert make_portable(adapter) == ["adapter_config.json"]
    written = json.loads((adapter / "adapter_config.json").read_text())
    assert written == {**config, "base_model_name_or_path": "results/x/ckpt/base"}
    # elsewhere (a hub id, a path outside the job's directory): as recorded
    assert portable_config("adapter_config.json", {"base_model_name_or_path": "/models/q"}) == {
        "base_model_name_or_path": "/models/q"
    }


def test_every_save_in_the_package_goes_through_the_portable_save():
    calls = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "stillroom").rglob("*.py"))
        if path.name != "saving.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.save_pretrained\(", line)
    ]
    assert calls == [], "save through stillroom.runtime.saving.save_pretrained"


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_a_model_config_keeps_its_values(name):
    config = {"model_type": "qwen3", "vocab_size": 296, "transformers_version": "5.25.0"}
    assert portable_config(name, config) == config
