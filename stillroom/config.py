"""Config validation against the JSON schema, with messages that name the key and what was expected."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

SCHEMA = Path(__file__).resolve().parent.parent / "config" / "schema.yaml"


class ConfigError(ValueError):
    pass


def _where(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def validate(config: Mapping[str, Any], schema_path: str | Path = SCHEMA) -> None:
    """Raise ConfigError listing every violation as `key.path: what was expected`."""
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(
        validator.iter_errors(dict(config)), key=lambda e: list(map(str, e.absolute_path))
    )
    if errors:
        lines = []
        for e in errors:
            where = _where(e.absolute_path)
            if e.validator == "additionalProperties":
                extra = sorted(set(e.instance) - set(e.schema.get("properties", {})))
                lines.append(
                    f"{where}: unknown key(s) {', '.join(map(repr, extra))}; "
                    f"allowed: {', '.join(sorted(e.schema.get('properties', {})))}"
                )
            else:
                lines.append(f"{where}: {e.message}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines))
    cross_check(config)


def cross_check(config: Mapping[str, Any]) -> None:
    """Constraints a JSON schema cannot express: references between sections."""
    problems = []
    gen = config["generation"]
    if gen["teacher"] not in config["teachers"]:
        problems.append(
            f"generation.teacher: '{gen['teacher']}' is not a key of teachers ({sorted(config['teachers'])})"
        )
    if config["dataset"]["default_effort"] not in gen["efforts"]:
        problems.append(
            f"dataset.default_effort: '{config['dataset']['default_effort']}' is not in generation.efforts"
        )
    for effort, n in gen.get("effort_shards", {}).items():
        if effort not in gen["efforts"]:
            problems.append(
                f"generation.effort_shards.{effort}: '{effort}' is not in generation.efforts"
            )
        elif n > gen["shards"]:
            problems.append(
                f"generation.effort_shards.{effort}: {n} is more than generation.shards ({gen['shards']})"
            )
    seen: set[str] = set()
    for i, group in enumerate(gen.get("effort_groups", [])):
        if set(group) - set(gen["efforts"]) or set(group) & seen:
            problems.append(
                f"generation.effort_groups.{i}: {group} must list efforts of generation.efforts, "
                f"each in at most one group"
            )
        seen |= set(group)
        if len({gen.get("effort_shards", {}).get(e, gen["shards"]) for e in group}) > 1:
            problems.append(
                f"generation.effort_groups.{i}: efforts of one group need the same effort_shards"
            )
    for i, src in enumerate(config["sources"]):
        need = {
            "arithmetic": "count",
            "choice": "count",
            "echo": "benchmark",
            "jsonl": "path",
            "dataset": "path",
            "kernels": None,
        }[src["kind"]]
        if need and need not in src:
            problems.append(f"sources.{i} ({src['name']}): kind '{src['kind']}' needs key '{need}'")
        if src["kind"] == "echo" and src.get("benchmark") not in config["benchmarks"]:
            problems.append(
                f"sources.{i}.benchmark: '{src.get('benchmark')}' is not a key of benchmarks"
            )
    splits = {"heldout": config["heldout"]["size"], "dev": config["heldout"].get("dev_size", 0)}
    for i, name in enumerate(config["eval"]["benchmarks"]):
        if name in splits and not splits[name]:
            problems.append(
                f"eval.benchmarks.{i}: '{name}' needs heldout.{'size' if name == 'heldout' else 'dev_size'} > 0"
            )
        if name not in splits and name not in config["benchmarks"]:
            problems.append(
                f"eval.benchmarks.{i}: '{name}' is neither 'heldout', 'dev' nor a key of benchmarks"
            )
    force = config["eval"].get("budget_force", {})
    models = (
        ["base", "sft"]
        + [f"merge-{r}" for r in config["merge"]["ratios"]]
        + (["grpo"] if "grpo" in config else [])
    )
    for key, known in (("models", models), ("benchmarks", config["eval"]["benchmarks"])):
        for i, name in enumerate(force.get(key, [])):
            if name not in known:
                problems.append(
                    f"eval.budget_force.{key}.{i}: '{name}' is not one of {', '.join(map(str, known))}"
                )
    select_on = config["merge"].get("select_on")
    if select_on is not None:
        if select_on in config["eval"]["benchmarks"]:
            problems.append(
                f"merge.select_on: '{select_on}' is also a reported benchmark (eval.benchmarks); "
                "choose the ratio on a split no table reports"
            )
        if select_on in splits and not splits[select_on]:
            problems.append(f"merge.select_on: '{select_on}' needs heldout.dev_size > 0")
        if select_on not in splits and select_on not in config["benchmarks"]:
            problems.append(
                f"merge.select_on: '{select_on}' is neither 'dev' nor a key of benchmarks"
            )
        if not config["merge"]["ratios"]:
            problems.append("merge.select_on needs merge.ratios to choose from")
    if "grpo" in config and not any(s["kind"] == "kernels" for s in config["sources"]):
        problems.append(
            "grpo: trains on the pool's kernel problems, but no source has kind 'kernels'"
        )
    names = [s["name"] for s in config["sources"]]
    if len(set(names)) != len(names):
        problems.append(f"sources: names must be unique, got {names}")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def config_hash(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
