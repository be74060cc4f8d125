"""Rules tokenizer, base and pretrained: the student, either a byte-level BPE tokenizer trained on
the pool and a random-weight base of the configured shape, or a pretrained model (path or hub id)
fetched by its job. Also the ``tiny`` stage: a random-weight model of a real model's architecture,
shrunk, for smoke runs of the exact code paths."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..config import Experiment, ModelShape, StageParams
from ..config.training import Tokenizer
from ..grading.formats import user_content
from ..io import atomic_dir, iter_jsonl, read_json
from ..provenance.sidecars import Notes, describe_model, sidecar_path
from ..runtime.saving import save_pretrained
from ..runtime.student import build_model, build_tiny_like, train_tokenizer
from .contract import stage


def _solution(rec: Mapping[str, Any], notes: Notes) -> tuple[str, ...]:
    """The reference solution a kernel record's meta names, if it has one (its file noted)."""
    meta = rec.get("meta") or {}
    if not meta.get("solution"):
        return ()
    from ..kernels.problemset import reference_solution  # the kernel package: kernel runs only

    return (reference_solution(meta["solution"], meta.get("family"), note=notes.add_file),)


class TokenizerParams(StageParams, Tokenizer):
    """The config's student.tokenizer section (BPE training has no randomness: the seed is only
    recorded)."""


def tokenizer_job_params(exp: Experiment) -> TokenizerParams:
    """The params of the tokenizer job: student.tokenizer."""
    return TokenizerParams(seed=exp.seed, **exp.student.tokenizer.model_dump())


@stage(
    "tokenizer",
    params=TokenizerParams,
    inputs=("pool",),
    outputs=("tokenizer",),
    help="train the student's byte-level BPE tokenizer on the pool",
)
def run_tokenizer(
    *,
    pool: str,
    out_tokenizer: str,
    params: Mapping[str, Any] | TokenizerParams,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> dict[str, Any]:
    p = TokenizerParams.parse(params, where="student.tokenizer")
    notes = Notes() if notes is None else notes
    # Prompts as asked and boxed gold answers: the pool's own text, independent of any teacher or
    # effort setting. A kernel's gold is its prompt; the code the student is to write is the
    # reference solution of a training problem that has one, so Triton's idioms get tokens of
    # their own (held-out problems are not in the pool).
    texts = [
        text
        for rec in iter_jsonl(pool, required=("prompt", "answer"), types={"prompt": str})
        for text in (
            (user_content(rec), *_solution(rec, notes))
            if rec.get("kind") == "kernel"
            else (rec["prompt"], f"The answer is \\boxed{{{rec['answer']}}}.")
        )
    ]
    tok = train_tokenizer(
        texts,
        out_tokenizer,
        vocab_size=p.vocab_size,
        min_frequency=p.min_frequency,
        pretokenize=p.pretokenize,
    )
    log(f"tokenizer: {len(tok)} tokens trained on {len(texts)} prompts")
    return {"texts": len(texts), "vocab": len(tok)}


class BaseParams(StageParams):
    model: ModelShape


def base_job_params(exp: Experiment) -> BaseParams:
    """The params of the base job: student.model, the random-weight base's shape."""
    return BaseParams(seed=exp.seed, model=exp.student.model)


@stage(
    "base",
    params=BaseParams,
    inputs=("tokenizer",),
    outputs=("model",),
    help="build the student base model with random weights",
)
def run_base(
    *,
    tokenizer: str,
    out_model: str,
    params: Mapping[str, Any] | BaseParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    p = BaseParams.parse(params, where="student")
    metrics = build_model(tokenizer, out_model, model=p.model, seed=p.seed)
    log(f"base model: {metrics['parameters']:,} parameters, vocab {metrics['vocab_size']}")
    return metrics


def random_weights(pretrained: str | None) -> bool:
    """Whether the student's base is a random-weight initialisation (the tables say so): built
    from scratch (no ``pretrained``), or ``pretrained`` a directory the ``tiny`` stage wrote (its
    sidecar names the stage)."""
    if not pretrained:
        return True
    side = sidecar_path(pretrained)
    return side.is_file() and read_json(side).get("stage") == "tiny"


class PretrainedParams(StageParams):
    pretrained: str


def pretrained_job_params(exp: Experiment, source: str) -> PretrainedParams:
    """The params of the pretrained job: ``source``, student.pretrained resolved (a local
    directory against the repository, else the hub id as configured)."""
    return PretrainedParams(seed=exp.seed, pretrained=source)


@stage(
    "pretrained",
    params=PretrainedParams,
    outputs=("model",),
    help="save a pretrained student (path or hub id) as the experiment's base",
)
def run_pretrained(
    *,
    out_model: str,
    params: Mapping[str, Any] | PretrainedParams,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> dict[str, Any]:
    """A pretrained student (path or hub id) saved into the experiment: the download happens in
    this job, never while the DAG is built."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = PretrainedParams.parse(params, where="student").pretrained
    tokenizer = AutoTokenizer.from_pretrained(source)
    net = AutoModelForCausalLM.from_pretrained(
        source, dtype=torch.bfloat16 if torch.cuda.is_available() else None
    )
    with atomic_dir(out_model) as tmp:
        save_pretrained(net, tmp)
        save_pretrained(tokenizer, tmp)
    # the commit transformers loaded from the hub (None for a local directory, hashed instead)
    notes = Notes() if notes is None else notes
    notes.add_model(source, "student", revision=getattr(net.config, "_commit_hash", None))
    n = sum(t.numel() for t in net.parameters())
    log(f"pretrained student {source}: {n:,} parameters")
    return {"parameters": n, "source": source}


class TinyParams(StageParams):
    like: str
    shrink: dict[str, int] = {}


@stage(
    "tiny",
    params=TinyParams,
    outputs=("model",),
    help="a random-weight smoke-test model of the same architecture as a real one, shrunk",
)
def run_tiny(
    *,
    out_model: str,
    params: Mapping[str, Any] | TinyParams,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> dict[str, Any]:
    p = TinyParams.parse(params, where="tiny")
    metrics = build_tiny_like(p.like, out_model, shrink=p.shrink, seed=p.seed)
    notes = Notes() if notes is None else notes
    notes.add_resolved(describe_model(p.like, "architecture"))  # only its config and tokenizer
    log(f"tiny {metrics['model_type']} like {p.like}: {metrics['parameters']:,} parameters")
    return metrics
