"""A broad table of broken variants of the embedded default and the recipes: each is refused by
``resolve`` (what the workflow runs while it is parsed, before any job) with a message naming the
key and what was wrong."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from stillroom.config import ConfigError, load_yaml, merge_configs, resolve

REPO = Path(__file__).resolve().parents[2]
DEFAULT = load_yaml(REPO / "config" / "config.yaml")
KERNELS = load_yaml(REPO / "config" / "experiments" / "autotriton-tiny.yaml")
DISTILL = load_yaml(REPO / "config" / "experiments" / "beam-distill.yaml")
SMOKE = load_yaml(REPO / "config" / "experiments" / "beam-tiny-smoke.yaml")
KERNELS_8B = load_yaml(REPO / "config" / "experiments" / "autotriton-8b.yaml")
QLORA_MP = merge_configs(DISTILL, load_yaml(REPO / "config" / "experiments" / "beam-qlora-mp.yaml"))


def _phased(phases):
    """A mutation training in ``phases``, without the top-level epochs the phases replace."""

    def mutate(config):
        config["train"].pop("epochs", None)
        config["train"]["phases"] = phases

    return mutate


def _rename(path: str, new: str):
    """A mutation moving the dotted ``path``'s value to the sibling key ``new``."""

    def mutate(config):
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[new] = node.pop(last)

    return mutate


def _set(path: str, value):
    """A mutation setting the dotted ``path`` (list indices as numbers) to ``value``."""

    def mutate(config):
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _drop(path: str):
    def mutate(config):
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        del node[last]

    return mutate


def _add_teacher(name: str, spec: dict):
    def mutate(config):
        config["teachers"][name] = spec

    return mutate


def _all(*mutations):
    def mutate(config):
        for m in mutations:
            m(config)

    return mutate


API = {"backend": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"}
# A second teacher for some efforts (generation.effort_teachers)
VERBOSE = _add_teacher("verbose", {"backend": "procedural", "detail": {"high": 3}})
SERVER = {"command": "python -m sglang.launch_server --model-path {model_path} --port {port}"}

NAME_RULE = "a plain directory name: letters, digits, '_', '-' and '.', not '.' or '..'"
SEED_RULE = "a seed is 0 <= seed < 2**32 = 4294967296, the range numpy and torch share"
FINITE = "Input should be a finite number"

# (name, base config, mutation, what the message must say)
BROKEN = [
    # top level
    ("unknown section", DEFAULT, _set("evals", {}), "unknown key 'evals' (did you mean 'eval'?)"),
    ("missing section", DEFAULT, _drop("generation"), "generation: required key missing"),
    ("experiment name", DEFAULT, _set("experiment", "a b"), f"experiment: {NAME_RULE} (got 'a b')"),
    # results/<experiment>/ is one directory: '..' wrote into the repository's own config/
    ("experiment ..", DEFAULT, _set("experiment", ".."), f"experiment: {NAME_RULE} (got '..')"),
    ("experiment .", DEFAULT, _set("experiment", "."), f"experiment: {NAME_RULE} (got '.')"),
    ("experiment path", DEFAULT, _set("experiment", "a/b"), f"experiment: {NAME_RULE} (got 'a/b')"),
    ("experiment empty", DEFAULT, _set("experiment", ""), f"experiment: {NAME_RULE} (got '')"),
    ("experiment with a dot", DEFAULT, _set("experiment", "tiny.v2"), None),
    ("negative seed", DEFAULT, _set("seed", -1), f"seed: {SEED_RULE} (got -1)"),
    ("string seed", DEFAULT, _set("seed", "1"), "seed: Input should be a valid integer"),
    # numpy refused 2**32 only in the train job, after generation; 2**64 named no key
    ("seed 2**32", DEFAULT, _set("seed", 2**32), f"seed: {SEED_RULE} (got 4294967296)"),
    ("seed 2**64", DEFAULT, _set("seed", 2**64), f"seed: {SEED_RULE} (got {2**64})"),
    ("largest seed", DEFAULT, _set("seed", 2**32 - 1), None),
    # .inf and .nan: a temperature of .inf sampled random tokens without a word
    (
        "infinite temperature",
        DEFAULT,
        _set("eval.temperature", math.inf),
        f"eval.temperature: {FINITE} (got inf)",
    ),
    (
        "infinite epochs",
        DEFAULT,
        _set("train.epochs", math.inf),
        f"train.epochs: {FINITE} (got inf)",
    ),
    ("nan lr", DEFAULT, _set("train.lr", math.nan), f"train.lr: {FINITE} (got nan)"),
    (
        "nan confidence",
        DEFAULT,
        _set("tables.confidence", math.nan),
        f"tables.confidence: {FINITE}",
    ),
    (
        "inf error rate",
        DEFAULT,
        _set("teachers.procedural.error_rate.low", -math.inf),
        f"teachers.procedural.error_rate.low: {FINITE} (got -inf)",
    ),
    (
        "inf source operand",
        DEFAULT,
        _set("cost.estimate.train_tokens_per_gpu_s", math.inf),
        f"cost.estimate.train_tokens_per_gpu_s: {FINITE}",
    ),
    (
        "nan in a server's own sampling field",
        DEFAULT,
        _add_teacher("api", {**API, "sampling": {"extra": {"guided": {"top_a": [0.1, math.nan]}}}}),
        f"teachers.api.sampling.extra.guided.top_a.1: {FINITE} (got nan)",
    ),
    (
        "nan in a row filter",
        DISTILL,
        _set("benchmarks.aime24.where", {"year": {"equals": math.nan}}),
        f"benchmarks.aime24.where.year.equals: {FINITE} (got nan)",
    ),
    # YAML 1.1 reads 3e-3 as a string (a float needs a dot and a signed exponent)
    (
        "lr with an exponent but no dot",
        DEFAULT,
        _set("train.lr", "3e-3"),
        "train.lr: Input should be a valid number (got '3e-3'): YAML reads 3e-3 as a string; "
        "write 3.0e-3",
    ),
    (
        "epochs with an unsigned exponent",
        DEFAULT,
        _set("train.epochs", "1.5E1"),
        "train.epochs: Input should be a valid number (got '1.5E1'): YAML reads 1.5E1 as a "
        "string; write 1.5e+1",
    ),
    (
        "count with an exponent",
        DEFAULT,
        _set("sources.0.count", "2e3"),
        "sources.0.count: Input should be a valid integer (got '2e3'): YAML reads 2e3 as a "
        "string; write 2000",
    ),
    (
        "a word where a number goes",
        DEFAULT,
        _set("train.lr", "fast"),
        "train.lr: Input should be a valid number (got 'fast')",
    ),
    # a teacher's name is a directory of gen/ and graded/
    (
        "teacher ..",
        DEFAULT,
        _all(_add_teacher("..", {"backend": "procedural"}), _set("generation.teacher", "..")),
        "teachers: key '..': String should match pattern '^[A-Za-z0-9_-]+$' (got '..')",
    ),
    # benchmarks
    (
        "benchmark typo",
        DISTILL,
        _set("benchmarks.aime24.promt", "q"),
        "benchmarks.aime24: unknown key 'promt'",
    ),
    (
        "benchmark kind",
        DISTILL,
        _set("benchmarks.aime24.answer_kind", "essay"),
        "benchmarks.aime24.answer_kind",
    ),
    ("benchmark limit", DISTILL, _set("benchmarks.aime24.limit", 0), "benchmarks.aime24.limit"),
    (
        "benchmark where",
        DISTILL,
        _set("benchmarks.aime24.where", {"x": {"over": 1}}),
        "benchmarks.aime24.where.x: unknown key 'over'",
    ),
    (
        "benchmark dir",
        DEFAULT,
        _set("benchmarks.tinybench", "config/benchmarks"),
        "benchmarks.tinybench: config/benchmarks is a directory",
    ),
    (
        "benchmark missing",
        DEFAULT,
        _set("benchmarks.tinybench", "config/nope.jsonl"),
        "benchmarks.tinybench: config/nope.jsonl does not exist",
    ),
    (
        "benchmark named heldout",
        DEFAULT,
        _set("benchmarks.heldout", "config/benchmarks/tinybench.jsonl"),
        "benchmarks.heldout: the name of a split of the pool",
    ),
    (
        "benchmark bad name",
        DEFAULT,
        _set("benchmarks.a/b", "config/benchmarks/tinybench.jsonl"),
        "benchmarks: key 'a/b': String should match pattern",
    ),
    (
        "benchmark not a spec",
        DEFAULT,
        _set("benchmarks.x", 3),
        "benchmarks.x: Input should be a valid dictionary",
    ),
    # sources
    ("source kind", DEFAULT, _set("sources.0.kind", "arith"), "sources.0: Input tag 'arith'"),
    ("source count zero", DEFAULT, _set("sources.0.count", 0), "sources.0.count"),
    (
        "source count bool",
        DEFAULT,
        _set("sources.0.count", True),
        "sources.0.count: Input should be a valid integer",
    ),
    (  # issue 29: drew for ever in the pool job
        "source count beyond what the generator can draw",
        DEFAULT,
        _set("sources.0.count", 10**15),
        "sources.0.count: count 1000000000000000 but only 223722 distinct prompts are available "
        "(kind arithmetic, max_operand 9); lower count",
    ),
    (
        "source count just beyond, a larger operand would do",
        DEFAULT,
        _set("sources.0.count", 300000),
        "sources.0.count: count 300000 but only 223722 distinct prompts are available "
        "(kind arithmetic, max_operand 9); raise max_operand to 11 or lower count",
    ),
    (
        "source count within reach of the operands but not of memory",
        DEFAULT,
        _all(_set("sources.1.count", 10**8), _set("sources.1.max_operand", 1000)),
        "sources.1.count: count 100000000 is more than the 10000000 prompts a generated source",
    ),
    ("source operand", DEFAULT, _set("sources.0.max_operand", 1), "sources.0.max_operand"),
    (
        "source key of another kind",
        DEFAULT,
        _set("sources.2.max_operand", 5),
        "sources.2: unknown key 'max_operand'",
    ),
    (
        "echo without benchmark",
        DEFAULT,
        _drop("sources.2.benchmark"),
        "sources.2.benchmark: required key missing",
    ),
    (
        "echo of unknown benchmark",
        DEFAULT,
        _set("sources.2.benchmark", "nope"),
        "sources.2.benchmark: 'nope' is not a key of benchmarks",
    ),
    (
        "duplicate source names",
        DEFAULT,
        _set("sources.1.name", "arith"),
        "sources: names must be unique",
    ),
    ("no sources", DEFAULT, _set("sources", []), "sources: List should have at least 1 item"),
    (
        "jsonl source missing file",
        DISTILL,
        _set("sources.1", {"name": "j", "kind": "jsonl", "path": "no.jsonl"}),
        "sources.1.path: no.jsonl does not exist",
    ),
    (
        "dataset file missing",
        DISTILL,
        _set("sources.1.path", "data/x.parquet"),
        "sources.1.path: data/x.parquet does not exist",
    ),
    (
        "kernel dir not a dir",
        KERNELS_8B,
        _set("sources.0.dir", "config/config.yaml"),
        "sources.0.dir: config/config.yaml is not a directory",
    ),
    (
        "procedural teacher on own kernel dir",
        KERNELS,
        _set("sources.0", {"name": "own", "kind": "kernels", "dir": "stillroom/kernels/problems"}),
        "sources.0 (own): the procedural teacher answers generated problems",
    ),
    (
        "kernel family with a dir",
        KERNELS,
        _set("sources.0.dir", "stillroom/kernels/problems"),
        "family: a generated family has no dir",
    ),
    ("unknown kernel family", KERNELS, _set("sources.0.family", "matmul"), "sources.0.family"),
    (
        "kernel problems file missing",
        KERNELS_8B,
        _set("sources.0.path", "no.jsonl"),
        "sources.0.path: no.jsonl does not exist",
    ),
    (
        "kernel problems from a dir and a file",
        KERNELS_8B,
        _set("sources.0", {"name": "k", "kind": "kernels", "dir": "d", "path": "p.jsonl"}),
        "dir and path: give one",
    ),
    (
        "kernel scaling to no elements",
        KERNELS,
        _set("sources.0.max_input_elements", 0),
        "sources.0.max_input_elements",
    ),
    (
        "kernel problems twice",
        KERNELS,
        _set("sources.0.problems", ["relu", "relu"]),
        "sources.0.problems: each problem may be listed once",
    ),
    (
        "procedural teacher on jsonl rows with meta",
        DEFAULT,
        _set(
            "sources.2", {"name": "j", "kind": "jsonl", "path": "config/benchmarks/tinybench.jsonl"}
        ),
        None,
    ),
    (
        "procedural teacher on a dataset",
        DEFAULT,
        _set("sources.2", {"name": "d", "kind": "dataset", "path": "some/hub-dataset"}),
        "sources.2 (d): the procedural teacher answers generated problems",
    ),
    (
        "sampling field of a server",
        DEFAULT,
        _add_teacher("api", {**API, "sampling": {"chat_template_kwargs": {}}}),
        "a server's own sampling fields go under extra",
    ),
    (
        "a server placeholder without a value",
        DEFAULT,
        _add_teacher(
            "s",
            {"backend": "sglang", "model": "m", "server": {"command": "x --gpus {gpus} {port}"}},
        ),
        "teachers.s.server.command: no value for {gpus}",
    ),
    (
        "a teacher named like a config class",
        DEFAULT,
        _add_teacher("Server", {**API, "timeout_s": -1}),
        "teachers.Server.timeout_s",
    ),
    # splits and decontamination
    ("heldout negative", DEFAULT, _set("heldout.size", -1), "heldout.size"),
    (
        "heldout typo",
        DEFAULT,
        _set("heldout.dev", 3),
        "heldout: unknown key 'dev'; allowed: dev_size, size",
    ),
    ("ngram too small", DEFAULT, _set("decontam.ngram", 2), "decontam.ngram"),
    ("ignore_common zero", DEFAULT, _set("decontam.ignore_common", 0), "decontam.ignore_common"),
    # generation
    (
        "unknown teacher",
        DEFAULT,
        _set("generation.teacher", "nope"),
        "generation.teacher: 'nope' is not a key of teachers",
    ),
    (
        "effort pattern",
        DEFAULT,
        _set("generation.efforts", ["low", "very high"]),
        "generation.efforts.1",
    ),
    (
        "effort twice",
        DEFAULT,
        _set("generation.efforts", ["low", "low"]),
        "generation.efforts: each effort may be listed once",
    ),
    ("shards zero", DEFAULT, _set("generation.shards", 0), "generation.shards"),
    (
        "effort_shards unknown effort",
        DEFAULT,
        _set("generation.effort_shards", {"xhigh": 1}),
        "generation.effort_shards.xhigh: 'xhigh' is not in efforts",
    ),
    (
        "effort_shards above shards",
        DEFAULT,
        _set("generation.effort_shards", {"low": 9}),
        "generation.effort_shards.low: 9 is more than shards (2)",
    ),
    (
        "effort group of one",
        DEFAULT,
        _set("generation.effort_groups", [["low"]]),
        "generation.effort_groups.0",
    ),
    (
        "effort in two groups",
        DISTILL,
        _set("generation.effort_groups", [["low", "high"], ["high", "xhigh"]]),
        "generation.effort_groups.1",
    ),
    (
        "effort teacher unknown",
        DEFAULT,
        _set("generation.effort_teachers", {"high": "nope"}),
        "generation.effort_teachers.high: 'nope' is not a key of teachers (['procedural'])",
    ),
    (
        "effort teacher of an effort not generated",
        DEFAULT,
        _all(VERBOSE, _set("generation.effort_teachers", {"xhigh": "verbose"})),
        "generation.effort_teachers.xhigh: 'xhigh' is not in efforts",
    ),
    (
        "effort group of two teachers",
        DISTILL,
        _set("generation.effort_teachers", {"low": "beam-api"}),
        "generation.effort_groups.0: ['low', 'high', 'xhigh'] mixes teachers (low: beam-api, "
        "high: beam-sglang, xhigh: beam-sglang); a group is one job with one server",
    ),
    (
        "effort group of another teacher",
        DISTILL,
        _set(
            "generation.effort_teachers",
            {"low": "beam-api", "high": "beam-api", "xhigh": "beam-api"},
        ),
        None,
    ),
    (
        "default teacher generates nothing",
        DEFAULT,
        _all(
            VERBOSE,
            _set("generation.effort_teachers", {e: "verbose" for e in ("low", "medium", "high")}),
        ),
        "generation.effort_teachers: every effort goes to another teacher, so teacher "
        "('procedural'), the reference the others are compared with, generates nothing",
    ),
    (
        "benchmark named like the teachers table",
        DEFAULT,
        _all(
            VERBOSE,
            _set("generation.effort_teachers", {"high": "verbose"}),
            _set("benchmarks.teachers", "config/benchmarks/tinybench.jsonl"),
            _set("eval.benchmarks", ["heldout", "teachers"]),
        ),
        "eval.benchmarks.1: 'teachers' would write tables/teachers.md",
    ),
    (
        "effort without detail at its own procedural teacher",
        DEFAULT,
        _all(
            VERBOSE,
            _set("generation.efforts", ["low", "medium", "high", "max"]),
            _set("teachers.procedural.detail", {"max": 3}),
            _set("generation.effort_teachers", {"max": "verbose"}),
        ),
        "teachers.verbose.detail: no detail level for effort 'max'",
    ),
    (
        "effort with detail at its own procedural teacher only",
        DEFAULT,
        _all(
            _add_teacher("verbose", {"backend": "procedural", "detail": {"max": 3}}),
            _set("generation.efforts", ["low", "medium", "high", "max"]),
            _set("generation.effort_teachers", {"max": "verbose"}),
        ),
        None,
    ),
    (
        "default effort unknown",
        DEFAULT,
        _set("dataset.default_effort", "xhigh"),
        "dataset.default_effort: 'xhigh' is not in generation.efforts",
    ),
    (
        "untagged fraction",
        DEFAULT,
        _set("dataset.untagged_fraction", 1.5),
        "dataset.untagged_fraction",
    ),
    # teachers
    (
        "teacher backend",
        DEFAULT,
        _set("teachers.procedural.backend", "vllm"),
        "teachers.procedural: Input tag 'vllm'",
    ),
    (
        "procedural error rate",
        DEFAULT,
        _set("teachers.procedural.error_rate", 2),
        "teachers.procedural.error_rate",
    ),
    (
        "procedural error rate effort",
        DEFAULT,
        _set("teachers.procedural.error_rate", {"lowx": 0.1}),
        "teachers.procedural.error_rate.lowx: 'lowx' is not an effort of this teacher",
    ),
    (
        "procedural detail level",
        DEFAULT,
        _set("teachers.procedural.detail", {"low": 7}),
        "teachers.procedural.detail.low",
    ),
    (
        "procedural effort without detail",
        DEFAULT,
        _set("generation.efforts", ["low", "medium", "ultra"]),
        "teachers.procedural.detail: no detail level for effort 'ultra'",
    ),
    (
        "procedural with an api key",
        DEFAULT,
        _set("teachers.procedural.base_url", "http://x"),
        "teachers.procedural: unknown key 'base_url'",
    ),
    (
        "sampling typo",
        DEFAULT,
        _add_teacher("api", {**API, "sampling": {"temprature": 0.7}}),
        "teachers.api.sampling: unknown key 'temprature' (did you mean 'temperature'?); allowed:",
    ),
    (
        "sampling top_p",
        DEFAULT,
        _add_teacher("api", {**API, "sampling": {"top_p": 2}}),
        "teachers.api.sampling.top_p",
    ),
    (
        "api without model",
        DEFAULT,
        _add_teacher("api", {"backend": "openai", "base_url": "http://x/v1"}),
        "teachers.api.model: required key missing",
    ),
    (
        "api url scheme",
        DEFAULT,
        _add_teacher("api", {**API, "base_url": "ftp://x"}),
        "teachers.api.base_url",
    ),
    (
        "api endpoint",
        DEFAULT,
        _add_teacher("api", {**API, "endpoint": "responses"}),
        "teachers.api.endpoint",
    ),
    (
        "api effort typo",
        DEFAULT,
        _add_teacher("api", {**API, "effort": {"feild": "x"}}),
        "teachers.api.effort: unknown key 'feild'",
    ),
    (
        "api effort template",
        DEFAULT,
        _add_teacher("api", {**API, "effort": {"system": "think $hard"}}),
        "teachers.api.effort.system: only $effort may be substituted",
    ),
    (
        "budget without a worst case",
        DEFAULT,
        _add_teacher("api", {**API, "budget": {"daily_output_tokens": 5}}),
        "teachers.api.budget: needs sampling.max_tokens or context_length",
    ),
    (
        "budget reset hour",
        DEFAULT,
        _add_teacher(
            "api",
            {
                **API,
                "context_length": 9,
                "budget": {"daily_output_tokens": 5, "reset_hour_utc": 24},
            },
        ),
        "teachers.api.budget.reset_hour_utc",
    ),
    (
        "price negative",
        DEFAULT,
        _add_teacher("api", {**API, "price": {"output_per_mtok": -1}}),
        "teachers.api.price.output_per_mtok",
    ),
    (
        "sglang without server",
        DEFAULT,
        _add_teacher("s", {"backend": "sglang", "model": "m"}),
        "teachers.s.server: required key missing",
    ),
    (
        "sglang placeholder unfilled",
        DEFAULT,
        _add_teacher(
            "s",
            {
                "backend": "sglang",
                "model": "m",
                "server": {"command": "x --tp {tp} --path {model_path} --port {port}"},
            },
        ),
        "teachers.s.server.command: no value for {model_path}",
    ),
    (
        "sglang unused server key",
        DEFAULT,
        _add_teacher(
            "s",
            {
                "backend": "sglang",
                "model": "m",
                "server": {"command": "x --port {port}", "reasoning_parser": "r1"},
            },
        ),
        "teachers.s.server.reasoning_parser: not a server setting",
    ),
    (
        "sglang tp zero",
        DEFAULT,
        _add_teacher(
            "s",
            {"backend": "sglang", "model": "m", "server": {"command": "x --port {port}", "tp": 0}},
        ),
        "teachers.s.server.tp",
    ),
    (
        "hf without model_path",
        DEFAULT,
        _add_teacher("h", {"backend": "hf"}),
        "teachers.h.model_path: required key missing",
    ),
    # student
    (
        "student both sources",
        DEFAULT,
        _set("student.pretrained", "Qwen/Qwen3-0.6B"),
        "student.pretrained: a pretrained student has no tokenizer or model",
    ),
    (
        "student neither",
        DEFAULT,
        _drop("student.model"),
        "student.pretrained: set it, or both tokenizer and model",
    ),
    (
        "effort tag without $effort",
        DEFAULT,
        _set("student.effort_tag", "{effort}"),
        "student.effort_tag: String should match",
    ),
    (
        "effort tag other variable",
        DEFAULT,
        _set("student.effort_tag", "$effort $mode"),
        "student.effort_tag: only $effort may be substituted",
    ),
    (
        "vocab too small",
        DEFAULT,
        _set("student.tokenizer.vocab_size", 10),
        "student.tokenizer.vocab_size",
    ),
    (
        "kv heads do not divide",
        DEFAULT,
        _set("student.model.num_key_value_heads", 3),
        "student.model.num_key_value_heads: 3 does not divide num_attention_heads (4)",
    ),
    (
        "model typo",
        DEFAULT,
        _set("student.model.hiden_size", 8),
        "student.model: unknown key 'hiden_size' (did you mean 'hidden_size'?)",
    ),
    (
        "moe keys on a dense model",
        DEFAULT,
        _set("student.model.num_experts", 4),
        "student.model.family: num_experts apply to family qwen3_moe only",
    ),
    (
        "moe without experts",
        SMOKE,
        _drop("student.model.num_experts"),
        "student.model.family: qwen3_moe needs num_experts",
    ),
    (
        "more experts per token than experts",
        SMOKE,
        _set("student.model.num_experts_per_tok", 99),
        "student.model.num_experts_per_tok",
    ),
    (
        "hook function",
        DEFAULT,
        _set("student.weight_hooks", [{"fn": "renorm", "match": ["x"]}]),
        "student.weight_hooks.0.fn",
    ),
    (
        "hook extra key",
        DEFAULT,
        _set("student.weight_hooks", [{"fn": "renorm_rows", "match": ["x"], "axis": 0}]),
        "student.weight_hooks.0: unknown key 'axis'",
    ),
    (
        "hook regex",
        DEFAULT,
        _set("student.weight_hooks", [{"fn": "renorm_rows", "match": ["("]}]),
        "student.weight_hooks.0.match.0: bad regular expression",
    ),
    (
        "hook without patterns",
        DEFAULT,
        _set("student.weight_hooks", [{"fn": "renorm_rows", "match": []}]),
        "student.weight_hooks.0.match",
    ),
    # training
    (
        "max_length too small",
        DEFAULT,
        _set("train.max_length", 8),
        "train.max_length: Input should be greater than or equal to 16",
    ),
    (
        "max_length above positions",
        DEFAULT,
        _set("train.max_length", 4096),
        "train.max_length: 4096 is more than the student's max_position_embeddings (512)",
    ),
    (
        "warmup ratio one",
        DEFAULT,
        _set("train.warmup_ratio", 1.0),
        "train.warmup_ratio: Input should be less than 1",
    ),
    (
        "lr as a string",
        DEFAULT,
        _set("train.lr", "1e-3"),
        "train.lr: Input should be a valid number",
    ),
    ("scheduler", DEFAULT, _set("train.lr_scheduler", "step"), "train.lr_scheduler"),
    (
        "train typo",
        DEFAULT,
        _set("train.lr_schedular", "cosine"),
        "train: unknown key 'lr_schedular' (did you mean 'lr_scheduler'?)",
    ),
    (
        "axolotl's spelling",
        DEFAULT,
        _set("train.learning_rate", 1e-3),
        "train.learning_rate: Axolotl's key; here it is train.lr",
    ),
    (
        "lora without lora",
        DEFAULT,
        _set("train.method", "lora"),
        "train.lora: method 'lora' needs a lora section",
    ),
    (
        "qlora without 4 bit",
        SMOKE,
        _set("train.method", "qlora"),
        "train.load_in_4bit: method 'qlora' needs load_in_4bit: true",
    ),
    (
        "4 bit full fine-tune",
        DEFAULT,
        _set("train.load_in_4bit", True),
        "train.load_in_4bit: 4-bit weights cannot be fine-tuned directly",
    ),
    (
        "lora on a full fine-tune",
        DEFAULT,
        _set("train.lora", {"r": 4, "alpha": 8, "target_modules": ["q_proj"]}),
        "train.lora: is set but method is 'full'",
    ),
    (
        "lora without targets",
        SMOKE,
        _set("train.lora", {"r": 4, "alpha": 8}),
        "train.lora.target_modules: set target_modules and/or target_parameters",
    ),
    (
        "lora on the router",
        SMOKE,
        _set("train.lora.target_modules", ["q_proj", "mlp.gate"]),
        "train.lora.target_modules: mlp.gate is the router",
    ),
    (
        "lora on the router's weight by its parameter name",
        SMOKE,
        _set("train.lora.target_parameters", ["mlp.experts.gate_up_proj", "gate.weight"]),
        "train.lora.target_parameters: gate.weight is the router",
    ),
    (
        "lora on a router spelled router",
        SMOKE,
        _set("train.lora.target_modules", ["q_proj", "mlp.router"]),
        "train.lora.target_modules: mlp.router is the router",
    ),
    (
        "flash attention 4, which is not shipped",
        DISTILL,
        _set("train.attn_implementation", "flash_attention_4"),
        "train.attn_implementation: flash_attention_4: this repository does not ship flash-attn-4",
    ),
    (
        "SonicMoE experts, which are not shipped",
        SMOKE,
        _set("train.use_sonicmoe", True),
        "train.use_sonicmoe: this repository does not ship SonicMoE's expert kernels",
    ),
    (
        "a 4-bit AdamW across the GPUs of a device map",
        QLORA_MP,
        _set("train.optim", "adamw_torch_4bit"),
        "train.optim: adamw_torch_4bit with a device_map across GPUs "
        "(distributed.gpus_per_node 8): adamw_torch_4bit fails once adapters span GPUs: use "
        "adamw_torch",
    ),
    (
        "lora dropout on experts",
        SMOKE,
        _set("train.lora.dropout", 0.1),
        "train.lora.dropout: must be 0 with target_parameters",
    ),
    (
        "training phases sharing a name",
        DEFAULT,
        _phased([{"name": "a", "epochs": 1}, {"name": "a", "epochs": 2}]),
        "train.phases: each phase name may be used once",
    ),
    (
        "training phase of an effort never generated",
        DEFAULT,
        _phased([{"name": "a", "epochs": 1, "efforts": ["xhigh"]}]),
        "train.phases.0.efforts: 'xhigh' is not one of generation.efforts",
    ),
    (
        "epochs beside training phases, which replace them",
        DEFAULT,
        _set("train.phases", [{"name": "a", "epochs": 1}]),
        "train.epochs: 1 would be overridden by train.phases, whose phases give their own (a 1)",
    ),
    (
        "training phases under their old key",
        DISTILL,
        _rename("train.phases", "stages"),
        "train.stages: renamed train.phases (same entries)",
    ),
    (
        "training phase without epochs",
        DEFAULT,
        _phased([{"name": "a"}]),
        "train.phases.0.epochs",
    ),
    (
        "training phase with a typo",
        DEFAULT,
        _phased([{"name": "a", "epochs": 1, "effort": ["low"]}]),
        "train.phases.0: unknown key 'effort' (did you mean 'efforts'?)",
    ),
    (
        "per-effort reference never generated",
        DEFAULT,
        _set("eval.per_effort.reference", "xhigh"),
        "eval.per_effort.reference: 'xhigh' is not one of generation.efforts",
    ),
    (
        "per-effort model unknown",
        DEFAULT,
        _set("eval.per_effort.models", ["sft", "merge-0.9"]),
        "eval.per_effort.models.1: 'merge-0.9' is not one of",
    ),
    (
        "per-effort benchmark not reported",
        DEFAULT,
        _set("eval.per_effort.benchmarks", ["dev"]),
        "eval.per_effort.benchmarks.0: 'dev' is not one of",
    ),
    (
        "splits carved from an unknown source",
        DEFAULT,
        _set("heldout.sources", ["arith", "deepmath"]),
        "heldout.sources.1: 'deepmath' is not one of arith, mcq, scraped",
    ),
    (
        "choices for a math answer",
        DISTILL,
        _set("benchmarks.gpqa.answer_kind", "math"),
        "benchmarks.gpqa.choices: options are lettered for answer_kind: choice only",
    ),
    (
        "training template missing",
        DEFAULT,
        _set("train.chat_template", "config/no-such-template.jinja"),
        "train.chat_template: config/no-such-template.jinja does not exist",
    ),
    (
        "training template a directory",
        DEFAULT,
        _set("train.chat_template", "config"),
        "train.chat_template: config is a directory",
    ),
    (
        "bf16 full fine-tune",
        DEFAULT,
        _set("train.dtype", "bfloat16"),
        "train.dtype: bfloat16 with method full",
    ),
    (
        "hooks on an adapter",
        SMOKE,
        _set("student.weight_hooks", [{"fn": "renorm_rows", "match": ["q_proj"]}]),
        "student.weight_hooks: they re-normalise trained weights",
    ),
    (
        "layout does not divide",
        DEFAULT,
        _set("train.distributed", {"nodes": 2, "gpus_per_node": 3, "dp_replicate_size": 4}),
        "train.distributed.dp_replicate_size: 4 does not divide the world size 6",
    ),
    (
        "layout product",
        DEFAULT,
        _set("train.distributed", {"nodes": 1, "gpus_per_node": 4, "fsdp_size": 3}),
        "train.distributed.fsdp_size: 3 x dp_replicate_size 1 must equal the world size 4",
    ),
    (
        "layout typo",
        DEFAULT,
        _set("train.distributed", {"node": 2}),
        "train.distributed: unknown key 'node' (did you mean 'nodes'?)",
    ),
    ("device map over nodes", DEFAULT, _set("train.distributed", {"nodes": 2}), None),
    (
        "max memory by GPU index",
        DEFAULT,
        lambda c: c["train"].update(device_map="auto", max_memory={0: "70GiB", "cpu": "1TiB"}),
        None,
    ),
    (
        "memory limit without a device map",
        DEFAULT,
        _set("train.gpu_memory_limit", "70GiB"),
        "train.gpu_memory_limit: gpu_memory_limit / max_memory only apply with device_map",
    ),
    (
        "sampled option not a list",
        DEFAULT,
        _set("train.sampled_options", {"loops": 3}),
        "train.sampled_options.loops",
    ),
    # GRPO and kernels
    (
        "grpo without kernel problems",
        DEFAULT,
        _set("grpo", {"max_steps": 1}),
        "grpo: trains on the pool's kernel problems",
    ),
    ("grpo group of one", KERNELS, _set("grpo.group_size", 1), "grpo.group_size"),
    ("grpo loss type", KERNELS, _set("grpo.loss_type", "ppo"), "grpo.loss_type"),
    (
        "grpo groups over processes",
        KERNELS,
        _set("grpo.distributed", {"gpus_per_node": 3}),
        "grpo.prompts_per_step: 4 must be a multiple of the 3 processes",
    ),
    (
        "grpo layout",
        KERNELS,
        _set("grpo.distributed", {"nodes": 1, "gpus_per_node": 2, "fsdp_size": 3}),
        "grpo.distributed.fsdp_size",
    ),
    ("validator device", KERNELS, _set("kernels.device", "gpu"), "kernels.device"),
    ("validator trials", KERNELS, _set("kernels.trials", 0), "kernels.trials"),
    ("validator block limit", KERNELS, _set("kernels.max_block_size", 0), "kernels.max_block_size"),
    (
        "kernel tables of an unknown benchmark",
        KERNELS,
        _set("kernels.benchmarks", ["nope"]),
        "kernels.benchmarks.0: 'nope' is not one of eval.benchmarks",
    ),
    # merges
    ("ratio of one", DEFAULT, _set("merge.ratios", [0.5, 1.0]), "merge.ratios.1"),
    # a ratio Python writes with an exponent names its model merge-1e-05, a valid identity
    ("ratio Python writes with an exponent", DEFAULT, _set("merge.ratios", [0.00001, 0.5]), None),
    ("ratio of zero", DEFAULT, _set("merge.ratios", [0.0, 0.5]), "merge.ratios.0"),
    (
        "ratio twice",
        DEFAULT,
        _set("merge.ratios", [0.5, 0.5]),
        "merge.ratios: each ratio may be listed once",
    ),
    (
        "select on a reported benchmark",
        DEFAULT,
        _set("merge.select_on", "heldout"),
        "merge.select_on: 'heldout' is also a reported benchmark",
    ),
    (
        "select on an unknown split",
        DEFAULT,
        _set("merge.select_on", "valid"),
        "merge.select_on: 'valid' is neither heldout nor dev",
    ),
    (
        "select on the training problems",
        DEFAULT,
        _set("merge.select_on", "train"),
        "merge.select_on: 'train' is what the models trained on",
    ),
    (
        "select without ratios",
        DEFAULT,
        _set("merge.ratios", []),
        "merge.select_on: needs merge.ratios to choose from",
    ),
    # evaluation
    (
        "unknown eval benchmark",
        DEFAULT,
        _set("eval.benchmarks", ["heldout", "nope"]),
        "eval.benchmarks.1: 'nope' is neither heldout nor dev nor train nor a key of benchmarks",
    ),
    (
        "dev without a dev split",
        DEFAULT,
        _set("heldout.dev_size", 0),
        "merge.select_on: 'dev' needs heldout.dev_size > 0",
    ),
    (
        "eval benchmark twice",
        DEFAULT,
        _set("eval.benchmarks", ["heldout", "heldout"]),
        "eval.benchmarks: each benchmark may be listed once",
    ),
    (
        "eval effort never trained",
        DEFAULT,
        _set("eval.effort", "ultra"),
        "eval.effort: 'ultra' is not one of generation.efforts",
    ),
    (
        "budget above the overall limit",
        DEFAULT,
        _set("eval.budget_force.budgets", [16, 500]),
        "eval.budget_force.budgets: 500 is more than max_new_tokens (96)",
    ),
    (
        "request above the overall limit",
        DEFAULT,
        _set("eval.request_tokens", 200),
        "eval.request_tokens: 200 is more than max_new_tokens (96)",
    ),
    (
        "no room for a prompt",
        DEFAULT,
        _set("eval.max_new_tokens", 512),
        "eval.max_new_tokens: 512 leaves no room for the prompt",
    ),
    (
        "budget of an unknown model",
        DEFAULT,
        _set("eval.budget_force.models", ["dpo"]),
        "eval.budget_force.models.0: 'dpo' is not one of base, sft",
    ),
    (
        "budget of an unknown benchmark",
        DEFAULT,
        _set("eval.budget_force.benchmarks", ["dev"]),
        "eval.budget_force.benchmarks.0: 'dev' is not one of",
    ),
    (
        "budget typo",
        DEFAULT,
        _set("eval.budget_force.budget", [3]),
        "eval.budget_force: unknown key 'budget'",
    ),
    (
        "letters repeat",
        DEFAULT,
        _set("eval.letters", "ABCA"),
        "eval.letters: letters must be distinct",
    ),
    (
        "backend typo",
        DEFAULT,
        _set("eval.backend", {"backend": "openai", "base_ur": "http://x"}),
        "eval.backend: unknown key 'base_ur' (did you mean 'base_url'?)",
    ),
    (
        "backend kind",
        DEFAULT,
        _set("eval.backend", {"backend": "vllm"}),
        "eval.backend: Input tag 'vllm'",
    ),
    (
        "sglang backend without the checkpoint",
        DEFAULT,
        _set("eval.backend", {"backend": "sglang", "server": {"command": "x --port {port}"}}),
        "eval.backend.server.command: must serve {model_path}",
    ),
    ("eval temperature", DEFAULT, _set("eval.temperature", -1), "eval.temperature"),
    # tables and cost
    ("too few resamples", DEFAULT, _set("tables.n_resamples", 10), "tables.n_resamples"),
    ("confidence of one", DEFAULT, _set("tables.confidence", 1), "tables.confidence"),
    ("negative rate", DEFAULT, _set("cost", {"gpu_hour_usd": -2}), "cost.gpu_hour_usd"),
    (
        "estimate throughput of zero",
        DISTILL,
        _set("cost.estimate.eval_tokens_per_s", 0),
        "cost.estimate.eval_tokens_per_s: Input should be greater than 0",
    ),
    (
        "estimate fraction of an effort not generated (a derived config's: left unused)",
        DEFAULT,
        _set("cost.estimate.correct_fraction", {"low": 1, "medium": 1, "high": 1, "max": 1}),
        None,
    ),
    (
        "estimate size of no benchmark",
        DISTILL,
        _set("cost.estimate.benchmark_sizes.aime26", 30),
        "cost.estimate.benchmark_sizes.aime26: not a key of benchmarks",
    ),
    (
        "estimate rows of a generated source",
        DEFAULT,
        _set("cost.estimate.source_rows", {"arith": 5}),
        "cost.estimate.source_rows.arith: not a dataset source",
    ),
]


@pytest.mark.parametrize(
    ("base", "mutate", "expected"),
    [pytest.param(base, mutate, expected, id=name) for name, base, mutate, expected in BROKEN],
)
def test_broken_config_is_refused_naming_the_key(base, mutate, expected):
    config = copy.deepcopy(base)
    mutate(config)
    if expected is None:  # a variant that is fine: the table also proves what is accepted
        resolve(config, REPO)
        return
    with pytest.raises(ConfigError) as err:
        resolve(config, REPO)
    assert expected in str(err.value), str(err.value)


def test_the_table_is_broad():
    assert sum(expected is not None for *_, expected in BROKEN) >= 100


@pytest.mark.parametrize("base", [DEFAULT, KERNELS, KERNELS_8B, DISTILL, SMOKE])
def test_every_recipe_resolves_with_every_default_filled_in(base):
    resolved = resolve(copy.deepcopy(base), REPO)
    assert (
        resolve(resolved, REPO) == resolved
    )  # resolving is idempotent: jobs re-check their params
    assert resolved["train"]["distributed"] == {
        **{
            "nodes": 1,
            "gpus_per_node": 1,
            "fsdp_size": None,
            "dp_replicate_size": 1,
            "expert_parallel_size": 1,
        },
        **base.get("train", {}).get("distributed", {}),
    }


def test_overlays_merge_key_by_key():
    overlay = load_yaml(REPO / "config" / "experiments" / "beam-lora-fsdp.yaml")
    resolved = resolve(merge_configs(DISTILL, overlay), REPO)
    assert (
        resolved["train"]["method"] == "lora"
        and resolved["sources"] == resolve(DISTILL, REPO)["sources"]
    )
