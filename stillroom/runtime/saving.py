"""Every model, tokenizer, config, generation config, processor or adapter written into an artifact
goes through ``save_pretrained`` here: transformers and PEFT write, besides what the object is, how
it was loaded in this process, and those values depend on the environment and the checkout's path,
not on the run's inputs. transformers 5 records in tokenizer_config.json the ``local_files_only``
it loaded with (True when ``HF_HUB_OFFLINE`` is set, as ``make run`` sets it, False from a plain
``snakemake``) and ``is_local``; a tokenizer class may keep any ``from_pretrained`` option it was
given (cache directory, token, revision) among the init kwargs it saves; PEFT records the base's
path as it was given. The same inputs must give the same bytes whatever the environment (the
sidecar's environment record says how the job ran), so these are dropped or made relative here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Options of from_pretrained and how it resolved them in this process: never a property of what was
# saved, and reloading sets them afresh.
LOADING_KEYS = frozenset(
    {
        "local_files_only",
        "is_local",
        "_is_local",
        "cache_dir",
        "token",
        "use_auth_token",
        "revision",
        "_commit_hash",
        "subfolder",
        "force_download",
        "resume_download",
        "proxies",
        "user_agent",
        "trust_remote_code",
        "name_or_path",
        "_name_or_path",
        "_from_auto",
        "_from_pipeline",
        "device_map",
    }
)
# The JSON files save_pretrained writes whose top-level keys may hold them.
CONFIG_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
    "processor_config.json",
    "preprocessor_config.json",
    "feature_extractor_config.json",
    "image_processor_config.json",
    "video_preprocessor_config.json",
)
ADAPTER_CONFIG = "adapter_config.json"


def portable_config(
    name: str, config: dict[str, Any], *, cwd: str | os.PathLike | None = None
) -> dict[str, Any]:
    """``config`` (the top level of the saved JSON file ``name``) as it is whatever the environment:
    a transformers config without the loading options, nor a ``*_file`` entry naming an absolute
    path (a vocabulary file resolved in the hub cache or a checkout); PEFT's adapter config with
    ``base_model_name_or_path``, when an absolute path under ``cwd`` (default: the current
    directory, which a workflow job and the merge after it share), made relative to it (its other
    keys are LoraConfig's fields, ``revision`` among them, and stay)."""
    if name == ADAPTER_CONFIG:
        out = dict(config)
        base = out.get("base_model_name_or_path")
        if isinstance(base, str) and os.path.isabs(base):
            here = Path(cwd if cwd is not None else os.getcwd()).resolve()
            resolved = Path(base).resolve()
            if resolved.is_relative_to(here):
                out["base_model_name_or_path"] = resolved.relative_to(here).as_posix()
        return out
    return {
        k: v
        for k, v in config.items()
        if k not in LOADING_KEYS
        and not (k.endswith("_file") and isinstance(v, str) and os.path.isabs(v))
    }


def make_portable(directory: str | os.PathLike) -> list[str]:
    """Rewrite the saved JSON configs in ``directory`` without environment-dependent values
    (``portable_config``), in transformers' own layout (sorted keys, two-space indent); the names
    of the files changed."""
    changed = []
    for name in (*CONFIG_FILES, ADAPTER_CONFIG):
        path = Path(directory) / name
        if not path.is_file():
            continue
        config = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            continue
        clean = portable_config(name, config)
        if clean != config:
            text = json.dumps(clean, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed


def save_pretrained(obj: Any, out_dir: str | os.PathLike, **kwargs: Any) -> None:
    """``obj.save_pretrained(out_dir, **kwargs)`` (a model, PEFT model, tokenizer, config,
    generation config or processor), its JSON configs then made environment-independent."""
    obj.save_pretrained(out_dir, **kwargs)
    make_portable(out_dir)
