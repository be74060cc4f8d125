"""The experiment config: typed sections (their keys, defaults, bounds and cross-checks, each
defined once), strict YAML loading, and the resolved config the workflow and every stage read.

``checked_experiment`` (through ``workflow_experiment``) is what the workflow runs while it is
parsed, its one parse of the config: every check that needs no job's output fails there, before any
job starts, with one message naming every bad key; ``resolve`` is its dump. The JSON schema for
editors (``stillroom schema``) is generated from the same definitions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .base import Boxed, ConfigError, Effort, Letters, Section, Seed, StageParams
from .data import LOCAL_DATA, DatasetSpec, Decontam, Heldout, Source
from .evaluation import (
    Backend,
    BudgetForce,
    Cost,
    Decoding,
    Estimate,
    Eval,
    Forcing,
    Kernels,
    PairedTables,
    SeededTables,
    Tables,
    ValidatorOptions,
)
from .experiment import SPLITS, TEACHERS_TABLE, Experiment
from .generation import (
    PROCEDURAL_DETAIL,
    DatasetSelection,
    Generation,
    HFSpec,
    OpenAISpec,
    ProceduralSpec,
    Sampling,
    Server,
    SGLangSpec,
    TeacherSpec,
)
from .models import ModelId, ModelKind
from .training import Distributed, Grpo, Layout, Lora, Merge, ModelShape, Student, Train, WeightHook

__all__ = [
    "LOCAL_DATA",
    "ModelId",
    "ModelKind",
    "PROCEDURAL_DETAIL",
    "SPLITS",
    "TEACHERS_TABLE",
    "Backend",
    "BudgetForce",
    "ConfigError",
    "Cost",
    "DatasetSelection",
    "DatasetSpec",
    "Decoding",
    "Decontam",
    "Distributed",
    "Effort",
    "Estimate",
    "Eval",
    "Experiment",
    "Forcing",
    "Generation",
    "Grpo",
    "Heldout",
    "Kernels",
    "Layout",
    "Letters",
    "Boxed",
    "Lora",
    "Merge",
    "PairedTables",
    "SeededTables",
    "ModelShape",
    "Sampling",
    "Section",
    "Seed",
    "StageParams",
    "Server",
    "Source",
    "Student",
    "Tables",
    "TeacherSpec",
    "HFSpec",
    "OpenAISpec",
    "ProceduralSpec",
    "SGLangSpec",
    "Train",
    "ValidatorOptions",
    "WeightHook",
    "config_hash",
    "load_yaml",
    "merge_configs",
    "checked_experiment",
    "resolve",
    "schema",
    "workflow_config",
    "workflow_experiment",
]


_MERGE = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (PyYAML keeps the last silently). Merge
    keys (``<<: *base``, ``<<: [*a, *b]``) merge as Snakemake's loader (PyYAML) merges them: a
    key written in the mapping overrides a merged one, and is no duplicate of it."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Flattening rewrites node.value (the merged keys, then the mapping's own), and a mapping
        # merged elsewhere may be flattened before it is itself constructed: its keys are checked
        # as written, before the first flattening, and once.
        if id(node) not in self._checked:
            self._checked.add(id(node))
            own = self._refuse_duplicates(node)
            self._refuse_ambiguous_merges(node, own)
        super().flatten_mapping(node)

    def _key(self, key_node: yaml.Node) -> Any:
        key = self.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:  # an unhashable key: PyYAML's own construction refuses it
            return None
        return key

    def _refuse_duplicates(self, node: yaml.MappingNode) -> set[Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            merge = key_node.tag == _MERGE
            key = "<<" if merge else self._key(key_node)
            if key is None:
                continue
            if key in seen:
                hint = " (merge several mappings with <<: [*a, *b])" if merge else ""
                raise ConfigError(
                    f"{key_node.start_mark.name}:{line}: key '{key}' is given twice "
                    f"(first on line {seen[key]}){hint}"
                )
            seen[key] = line
        return set(seen) - {"<<"}

    def _refuse_ambiguous_merges(self, node: yaml.MappingNode, own: set[Any]) -> None:
        """A key that reaches a mapping from two merged mappings (``<<: [*a, *b]`` both giving it,
        or a merged mapping that overrides its own merge): YAML takes the first, PyYAML (so
        Snakemake) keeps whichever its key's string identity happens to favour. Refused unless
        the mapping gives the key itself, where both agree."""
        subnodes = [
            sub
            for key_node, value in node.value
            if key_node.tag == _MERGE
            for sub in (value.value if isinstance(value, yaml.SequenceNode) else [value])
            if isinstance(sub, yaml.MappingNode)  # else PyYAML's own error, with its line
        ]
        seen: dict[Any, yaml.Node] = {}
        for sub in subnodes:
            self.flatten_mapping(sub)
            for key_node, _ in sub.value:
                key = self._key(key_node)
                if key is None or key in own:
                    continue
                first = seen.setdefault(key, key_node)
                if first is not key_node:  # the same mapping merged twice gives the same node
                    raise ConfigError(
                        f"{node.start_mark.name}:{node.start_mark.line + 1}: key '{key}' is "
                        f"merged from two mappings (lines {first.start_mark.line + 1} and "
                        f"{key_node.start_mark.line + 1}), and YAML loaders disagree on which "
                        f"wins: give '{key}' in this mapping itself"
                    )


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A config file as a dict; a syntax error or a duplicated key names the file and line."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:  # a stream: marks name the file
            data = yaml.load(fh, Loader=_StrictLoader)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = exc.problem or exc.context
        if exc.problem and exc.context and exc.context_mark:  # where the broken construct began
            at = exc.context_mark
            problem += f" ({exc.context} at line {at.line + 1}, column {at.column + 1})"
        if "'\\t'" in problem:
            problem += "; YAML indents with spaces only"
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:  # nothing but blanks and comments
        raise ConfigError(f"{path}: empty: expected a mapping of config sections")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of config sections, got {type(data).__name__}"
        )
    return data


def checked_experiment(config: Mapping[str, Any], root: str | Path = ".") -> Experiment:
    """The config parsed and checked, every default filled in. Local paths are checked against
    ``root`` (the repository: config paths are relative to it)."""
    experiment = Experiment.parse(dict(config))
    problems = experiment.file_problems(Path(root))
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return experiment


def resolve(config: Mapping[str, Any], root: str | Path = ".") -> dict[str, Any]:
    """The config checked, with every default filled in: what the rules pass to the stages."""
    return checked_experiment(config, root).dump()


def workflow_experiment(
    config: Mapping[str, Any],
    configfiles: Iterable[str | Path],
    default: str | Path,
    root: str | Path,
) -> Experiment:
    """The checked experiment of a workflow run. Snakemake has merged the ``--configfile`` files and
    ``--config`` values into ``config``; each file is read again here, to refuse duplicated keys.
    Without a config file the embedded default is loaded, under any ``--config`` values."""
    files = list(configfiles)
    for path in files:
        load_yaml(path)
    merged = dict(config) if files else merge_configs(load_yaml(default), config)
    return checked_experiment(merged, root)


def workflow_config(
    config: Mapping[str, Any],
    configfiles: Iterable[str | Path],
    default: str | Path,
    root: str | Path,
) -> dict[str, Any]:
    """The resolved config of a workflow run (``workflow_experiment``, dumped)."""
    return workflow_experiment(config, configfiles, default, root).dump()


def merge_configs(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base`` key by key, as Snakemake merges config files."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge_configs(out[key], value)
        else:
            out[key] = value
    return out


def config_hash(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def schema() -> dict[str, Any]:
    """The JSON schema of an experiment config (for editors and other tools)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **Experiment.model_json_schema(),
    }
