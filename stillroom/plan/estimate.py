"""The bill before the run: output tokens, GPU-hours, wall time and dollars of every GPU stage,
predicted from the config alone, offline, in milliseconds.

Counts come from the config: pool prompts (source counts and limits, less the held-out splits),
shards and effort_shards, samples per prompt, train.phases and epochs, merge ratios, evaluated
models x benchmarks x budgets x efforts. GPUs per job are the rules' job shapes
(stillroom/plan/cluster.py, over ``cost.gpus``), as the ledger charges them. Throughputs, lengths
and the sizes of hub datasets are figures of ``cost.estimate`` (stillroom/config/evaluation.py),
those of one model under ``cost.estimate.models`` (by its size). Dollars are GPU-hours x the price
of the rule's GPU type (``cost.gpu_types``, else ``cost.gpu_hour_usd``) plus the teacher's tokens x
its ``price``, as in the ledger. A job whose GPUs cannot hold its model (the weights' bytes against
GPUs x memory x ``memory_fraction``) is refused, naming model, job shape and memory.

Wall time: the parts (generation, training, merges, evaluation) one after another; the jobs of a
part at once, or ``cost.estimate.parallel_jobs`` at a time (longest first); train.phases one
after another. ``stillroom estimate`` prints it; rule ``cost`` (stillroom/stages/cost.py) sets
it beside what the run spent.
"""

from __future__ import annotations

import csv
import heapq
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import SPLITS, ConfigError, Experiment
from ..config.data import KernelSource
from ..config.evaluation import Architecture, ModelFigures
from ..config.training import Layout, Lora, Train, TrainPhase
from ..io import DataError
from .cluster import backend_gpus, stage_gpus
from .generation import RULE, effort_keys, gpu_key, server_of, teacher_servers

# The parts of the pipeline the bill sums, in the order they run (not train.phases, the steps of
# a fine-tune's curriculum, which are billed within training)
PARTS = ("generation", "training", "merge", "evaluation")


class EstimateError(ConfigError):
    """A figure the estimate needs is missing from the config; the message names its key."""


# Bytes of a weight in NF4 with double-quantised scales (torchao's layout, and bitsandbytes' with
# bnb_4bit_use_double_quant): 4 bits, an int8 scale per 64 weights, a float32 factor per 256 scales
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
GB = 1e9
# Optimizer state per trained parameter: its moments (transformers' optimizer names) x their bytes
# (float32; one byte in an 8-bit optimizer, half in torchao's 4-bit one)
_MOMENTS = {"sgd": 0, "lomo": 0, "adalomo": 0, "lion": 1, "rmsprop": 1, "adagrad": 1}
_MOMENTS |= {"adafactor": 1, "ademamix": 3, "grokadamw": 3, "schedule_free": 1}
# The tiles of TRL's fused LM head (trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE, and the
# vocabulary width trl/trainer/utils.py passes it): tokens and vocabulary entries of one tile
TRL_TOKEN_TILE = 4096
TRL_VOCAB_TILE = 32768


def optimizer_bytes(optim: str) -> float:
    """Bytes of optimizer state per trained parameter (AdamW: two float32 moments, 8)."""
    moments = next((n for key, n in _MOMENTS.items() if optim.startswith(key)), 2)
    width = 1.0 if "8bit" in optim else 0.5 if "4bit" in optim else 4.0
    return moments * width


def architecture_of(model_dir: Path) -> Architecture:
    """A local model's shape from its config.json (a multimodal model's text_config)."""
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EstimateError(f"{path}: cannot read the model's config ({exc})") from None
    config = config.get("text_config", config)
    config.setdefault("num_experts", config.get("num_local_experts"))
    if config.get("head_dim") is None and config.get("num_attention_heads"):
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    keys = {k: config.get(k) for k in Architecture.model_fields if config.get(k) is not None}
    if keys.get("num_experts"):
        keys.pop("intermediate_size", None)  # a dense layer's, where a MoE has any
    try:
        return Architecture.parse(keys)
    except ConfigError as exc:
        raise EstimateError(f"{path}: not a shape the estimate knows ({exc})") from None


def parameters(a: Architecture) -> dict[str, float]:
    """The model's parameters by part: the decoder layers' attention projections and MLP (experts
    or dense), the rest of the layers (norms, routers), and the embeddings (input, and output
    when untied)."""
    h, q, kv = a.hidden_size, a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    per_layer_rest = 2 * h + 2 * a.head_dim  # two layer norms, q_norm and k_norm
    if a.num_experts:
        mlp = a.num_experts * 3 * h * a.moe_intermediate_size
        per_layer_rest += a.num_experts * h  # the router
    else:
        mlp = 3 * h * a.intermediate_size
    n = a.num_hidden_layers
    return {
        "attention": n * (2 * h * q + 2 * h * kv),
        "mlp": n * mlp,
        "layer_rest": n * per_layer_rest + h,  # and the final norm
        "embeddings": a.vocab_size * h * (1 if a.tie_word_embeddings else 2),
    }


def lora_parameters(a: Architecture, lora: Lora) -> int:
    """LoRA's parameters on ``a``: r x (in + out) per adapted projection (attention, dense MLP)
    of every layer, r x experts x (in + out) per adapted fused expert parameter (PEFT's
    ParamWrapper layout, one r-rank pair per expert). A target the estimate cannot size is
    refused."""
    h, q, kv = a.hidden_size, a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    i = a.intermediate_size
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    if not a.num_experts:
        shapes |= {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    per_layer = 0
    for target in lora.target_modules:
        if target.rsplit(".", 1)[-1] not in shapes:
            raise EstimateError(
                f"train.lora.target_modules: '{target}' is none of the projections the memory "
                f"estimate sizes ({', '.join(shapes)})"
            )
        fan_in, fan_out = shapes[target.rsplit(".", 1)[-1]]
        per_layer += lora.r * (fan_in + fan_out)
    experts = {"gate_up_proj": (h, 2 * (a.moe_intermediate_size or 0))}
    experts["down_proj"] = (a.moe_intermediate_size or 0, h)
    for target in lora.target_parameters:
        name = target.rsplit(".", 1)[-1]
        if not a.num_experts or name not in experts:
            raise EstimateError(
                f"train.lora.target_parameters: '{target}' is no fused expert parameter of "
                "the model (gate_up_proj, down_proj of a MoE's experts)"
            )
        per_layer += lora.r * a.num_experts * sum(experts[name])
    return per_layer * a.num_hidden_layers


def activation_bytes(a: Architecture, train: Train, dtype_bytes: float) -> dict[str, float]:
    """Bytes of one micro-batch's activations (batch_size packed rows of max_length tokens), by
    what holds them, as the Qwen3 / Qwen3-MoE layers save them for the backward (counted from
    their saved tensors: tests/plan/test_estimate.py measures a step's):

    - a layer, per token: its two RMSNorms' float32 inputs (4h each), q_norm's and k_norm's
      float32 inputs (4 (q + kv)), attention's q, k, v and output (c (2q + 2kv)); each adapted
      projection's input in the LoRA's float32 (4 in) and its rank-r output (4r); the MLP's input
      and output and its two I-wide products (a MoE: per routed copy, k per token, with its
      experts' LoRA the same way; the router's float32 logits); PEFT's LoRA on fused experts
      (not the NF4 ones) also keeps the layer's experts with their delta, c per weight. A full
      fine-tune's trained weights keep what their gradients read besides: each norm's
      normalised output, the attention's input and a MoE's router's and experts' inputs.
    - with gradient checkpointing: each layer's input (c h a token) and one layer's activations,
      recomputed in the backward; without: every layer's.
    - the loss: TRL's SFTTrainer computes it through its fused LM head (trl.trainer.utils
      add_fused_lm_head), which never holds the logits: it projects tiles of TRL_TOKEN_TILE
      tokens x TRL_VOCAB_TILE vocabulary entries (c each) and keeps each token's log-sum-exp.
      Per token it saves the final norm's float32 input (4h), the head's copy of its input rows
      (c h; the norm's output too, c h, when the norm trains: method full) and its statistics
      (32 at most: log-sum-exp, entropy, target, mask); its backward adds the float32 gradient
      of those rows and its cast (4h + c h), and one tile of the logits and one of the head's
      weight, c x TRL_VOCAB_TILE x (TRL_TOKEN_TILE + h), whatever the vocabulary (a chunked
      loss such as Cut Cross Entropy holds about as much).

    c: the compute dtype's bytes."""
    c, h = dtype_bytes, a.hidden_size
    q, kv = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    tokens = train.batch_size * train.max_length
    lora = train.lora
    r = lora.r if lora else 0
    adapted = {t.rsplit(".", 1)[-1] for t in lora.target_modules} if lora else set()
    inputs = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": q}
    if not a.num_experts:
        inputs |= {"gate_proj": h, "up_proj": h, "down_proj": a.intermediate_size}
    token = 2 * 4 * h + 4 * (q + kv) + c * (2 * q + 2 * kv)
    token += sum(4 * inputs[t] + 4 * r for t in adapted if t in inputs)
    per_layer_fixed = 0.0
    if a.num_experts:
        i, k = a.moe_intermediate_size, a.num_experts_per_tok
        copy = 2 * c * h + 2 * c * i + c  # input, output, the two products, routing weight
        experts = {t.rsplit(".", 1)[-1] for t in lora.target_parameters} if lora else set()
        if train.quantize_moe_experts:  # the NF4 experts' LoRA, run on each routed row
            copy += (4 * h + 4 * r) * ("gate_up_proj" in experts)
            copy += (4 * i + 4 * r) * ("down_proj" in experts)
        elif experts:  # PEFT adds the delta to the whole weight of the layer's experts
            per_layer_fixed = c * a.num_experts * 3 * h * i
        token += 4 * a.num_experts + 24 * k + k * copy
    else:
        token += c * (h + 4 * a.intermediate_size)  # input; gate, up, activation, product
    if train.method == "full":
        # trained weights keep what their gradients read: the four norms' normalised outputs
        # (c (2h + q + kv)) and the attention's input (c h); a MoE's router its input (c h), each
        # routed copy its input and the down projection's (a dense MLP's are counted above)
        mlp = h + a.num_experts_per_tok * (h + a.moe_intermediate_size) if a.num_experts else 0
        token += c * (3 * h + q + kv + mlp)
    layer = token * tokens + per_layer_fixed
    out = {}
    if train.gradient_checkpointing:
        out["layer inputs (gradient checkpointing)"] = a.num_hidden_layers * c * h * tokens
        out["one layer's activations, recomputed"] = layer
    else:
        out["every layer's activations"] = a.num_hidden_layers * layer
    tile = min(tokens, TRL_TOKEN_TILE) + h
    saved = (4 + c * (2 if train.method == "full" else 1)) * h + 32
    out["the loss (TRL's fused LM head)"] = (saved + (4 + c) * h) * tokens + (
        c * min(a.vocab_size, TRL_VOCAB_TILE) * tile
    )
    return out


@dataclass
class Row:
    """One line of the estimate: a set of jobs of one rule."""

    part: str  # one of PARTS
    rule: str
    label: str
    jobs: int
    gpus_per_job: int
    tokens: float | None  # output tokens (generation, evaluation) or tokens trained (training)
    tokens_kind: str  # "output", "trained" or "" (none estimated)
    gpu_hours: float
    job_hours: float  # wall time of the jobs, summed
    wall_s: float  # these jobs alone, at the configured parallelism
    gpu_usd: float
    api_usd: float = 0.0
    input_tokens: float = 0.0
    teacher: str | None = None
    effort: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def usd(self) -> float:
        return self.gpu_usd + self.api_usd


@dataclass
class Bill:
    experiment: str
    inputs: dict[str, Any]
    rows: list[Row]
    parts: dict[str, dict[str, float]]  # jobs (a count), GPU- and job-hours, wall_s, dollars
    total: dict[str, float]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "inputs": self.inputs,
            "rows": [{**asdict(r), "usd": r.usd} for r in self.rows],
            "parts": self.parts,
            "total": self.total,
            "notes": self.notes,
        }

    def by_rule(self) -> dict[str, dict[str, float | None]]:
        """Per rule, as the ledger's GPU rows: tokens, GPU-hours, job-hours and GPU dollars."""
        out: dict[str, dict[str, float | None]] = {}
        for r in self.rows:
            agg = out.setdefault(
                r.rule, {"tokens": None, "gpu_hours": 0.0, "job_hours": 0.0, "gpu_usd": 0.0}
            )
            if r.tokens is not None:
                agg["tokens"] = (agg["tokens"] or 0.0) + r.tokens
            for key in ("gpu_hours", "job_hours", "gpu_usd"):
                agg[key] = (agg[key] or 0.0) + getattr(r, key)
        return out

    def by_teacher_effort(self) -> dict[tuple[str, str], dict[str, float]]:
        """Per (teacher, effort), as the ledger's API rows: input and output tokens, API dollars."""
        return {
            (r.teacher, r.effort): {
                "input_tokens": r.input_tokens,
                "output_tokens": r.tokens or 0.0,
                "api_usd": r.api_usd,
            }
            for r in self.rows
            if r.teacher is not None and r.effort is not None
        }


def bill(config: Mapping[str, Any] | Experiment, root: str | Path = ".") -> Bill:
    """The estimate of a resolved (or raw) experiment config; relative local paths start at
    ``root`` (the repository). EstimateError names a missing figure's key."""
    exp = config if isinstance(config, Experiment) else Experiment.parse(dict(config))
    missing = missing_figures(exp)
    if missing:
        raise EstimateError("cannot estimate:\n  " + "\n  ".join(missing))
    return _Billing(exp, Path(root)).run()


def missing_figures(exp: Experiment) -> list[str]:
    """A figure given per effort or per benchmark covers every one of the experiment (figures for
    others are left unused, so that one block serves a recipe and configs derived from it)."""
    est, problems = exp.cost.estimate, []
    per = (
        ("teacher_output_tokens", est.teacher_output_tokens, exp.generation.efforts, "effort"),
        ("correct_fraction", est.correct_fraction, exp.generation.efforts, "effort"),
        ("eval_output_tokens", est.eval_output_tokens, exp.evaluated, "benchmark"),
    )
    for key, figure, wanted, what in per:
        missing = [w for w in wanted if isinstance(figure, dict) and w not in figure]
        if missing:
            problems.append(
                f"cost.estimate.{key}: no figure for {what} {', '.join(missing)} "
                f"(give one number for all, or one per {what}; given for "
                f"{', '.join(figure) or 'none'})"
            )
    return problems


def markdown(p: Bill) -> str:
    """The estimate as a markdown report: what it rests on, a row per stage, each part's totals."""
    i = p.inputs
    lines = [f"### Estimate: {p.experiment}", ""]
    lines.append(
        f"Pool {i['pool_prompts']:,} prompts in {i['shards']} shards; "
        + "; ".join(f"{e}: {n:,} prompts" for e, n in i["prompts_per_effort"].items())
        + f"; {_n(i['samples_per_prompt'], 'sample')} per prompt. Dataset rows: "
        + ", ".join(f"{e} {n:,}" for e, n in i["dataset_rows"].items())
        + "."
    )
    lines.append(
        "Benchmarks (problems): "
        + ", ".join(f"{b} {n:,}" for b, n in i["benchmark_problems"].items())
        + f". {_rates(i)}."
    )
    lines += [
        "",
        "| part | rule | what | jobs | GPUs/job | tokens | GPU-hours | wall | GPU $ | API $ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for part in PARTS:
        rows = [r for r in p.rows if r.part == part]
        if not rows:
            continue
        for r in rows:
            tokens = f"{_si(r.tokens)} {r.tokens_kind}" if r.tokens is not None else "–"
            kind = i["gpu_type_by_rule"].get(r.rule)
            gpus = f"{r.gpus_per_job} {kind}" if kind and r.gpus_per_job else r.gpus_per_job
            lines.append(
                f"| {part} | {r.rule} | {r.label} | {r.jobs} | {gpus} | {tokens} | "
                f"{r.gpu_hours:,.2f} | {_duration(r.wall_s)} | {r.gpu_usd:,.2f} | "
                f"{r.api_usd:,.2f} |"
            )
        t = p.parts[part]
        lines.append(
            f"| **{part}** | | | {t['jobs']} | | | **{t['gpu_hours']:,.2f}** | "
            f"**{_duration(t['wall_s'])}** | **{t['gpu_usd']:,.2f}** | **{t['api_usd']:,.2f}** |"
        )
    t = p.total
    lines += [
        f"| **total** | | | {t['jobs']} | | | **{t['gpu_hours']:,.2f}** | "
        f"**{_duration(t['wall_s'])}** | **{t['gpu_usd']:,.2f}** | **{t['api_usd']:,.2f}** |",
        "",
        f"**Estimated total: ${t['usd']:,.2f}** (GPU ${t['gpu_usd']:,.2f} + API "
        f"${t['api_usd']:,.2f}); generation and training ${t['generation_training_usd']:,.2f}; "
        f"wall {_duration(t['wall_s'])} with the parts one after another.",
    ]
    lines += _starts_and_tokens(p)
    for phase, m in i.get("train_memory", {}).items():
        lines += [
            "",
            f"Training memory per GPU{f' ({phase})' if phase else ''}, {m['how']}: "
            f"{m['need_gb']:,.1f} GB of {m['room_gb']:,.1f} GB: "
            + "; ".join(f"{k} {v:,.1f} GB" for k, v in m["terms_gb"].items())
            + ".",
        ]
    if p.notes:
        lines += ["", *(f"- {n}" for n in p.notes)]
    return "\n".join(lines) + "\n"


def _starts_and_tokens(p: Bill) -> list[str]:
    """Generation's dollars per million output tokens (beside the source's reported figure) and
    each part's model starts."""
    lines = []
    gen, ev = p.parts.get("generation", {}), p.parts.get("evaluation", {})
    if gen.get("output_tokens"):
        per = gen["usd"] / gen["output_tokens"] * 1e6
        line = (
            f"Generation: ${gen['usd']:,.2f} for {_si(gen['output_tokens'])} output tokens, "
            f"**${per:.2f} per million output tokens**"
        )
        reported = p.inputs["figures"].get("reported_usd_per_mtok")
        if reported:
            low, high = reported
            mid = (low + high) / 2
            line += (
                f" (the source's own: ${low:.2f}–{high:.2f}, cost.estimate.reported_usd_per_mtok; "
                f"{per / mid - 1:+.0%} from its middle)"
            )
        if gen.get("starts"):
            alone = (gen["usd"] - gen["start_usd"]) / gen["output_tokens"] * 1e6
            line += (
                f"; ${alone:.2f} for the tokens alone, without the "
                f"{_n(gen['starts'], 'teacher start')}: {gen['start_gpu_hours']:,.2f} GPU-hours, "
                f"{gen['start_gpu_hours'] / gen['gpu_hours']:.1%} of generation's"
            )
        lines += ["", line + "."]
    if ev:
        lines += [
            "",
            f"Evaluation: {_n(ev.get('starts', 0), 'model start')} for its {_n(ev['jobs'], 'job')}"
            + (
                f", {ev['start_gpu_hours']:,.2f} GPU-hours "
                f"({ev['start_gpu_hours'] / ev['gpu_hours']:.1%} of evaluation's)."
                if ev.get("starts")
                else "."
            ),
        ]
    return lines


def _rates(inputs: Mapping[str, Any]) -> str:
    """The price of a GPU-hour: one rate, or each GPU type's and the rules on it."""
    types = inputs["gpu_types"]
    if not types:
        return f"Rate ${inputs['gpu_hour_usd']:g}/GPU-hour"
    on: dict[str, list[str]] = {}
    for rule, kind in inputs["gpu_type_by_rule"].items():
        if inputs["gpus"].get(rule):
            on.setdefault(kind, []).append(rule)
    return "GPU-hour prices: " + "; ".join(
        f"{kind} ${t['usd_per_hour']:g} ({t['memory_gb']:g} GB"
        + (f"; {', '.join(on[kind])}" if kind in on else "")
        + ")"
        for kind, t in types.items()
    )


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _si(n: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}"
    return f"{n:.0f}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def makespan(durations: list[float], slots: int | None) -> float:
    """Wall time of jobs on ``slots`` workers, longest first (all at once when None)."""
    if not durations:
        return 0.0
    if slots is None or slots >= len(durations):
        return max(durations)
    loads = [0.0] * slots
    for d in sorted(durations, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + d)
    return max(loads)


def count_rows(path: Path) -> int:
    """Rows of a local data file (JSONL, JSON, CSV, parquet), read offline; parquet from its
    footer only."""
    suffix = path.suffix
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        if suffix not in (".csv", ".json"):
            # counted as bytes: a count needs no decoding, so bad bytes are left to the job
            with open(path, "rb") as fh:
                return sum(1 for line in fh if line.strip())
        with open(path, encoding="utf-8") as fh:
            if suffix == ".csv":
                return max(0, sum(1 for _ in csv.reader(fh)) - 1)
            if suffix == ".json":
                text = fh.read()
                try:
                    data = json.loads(text)
                except json.JSONDecodeError:  # JSON lines under a .json name, as datasets reads
                    return sum(1 for line in text.splitlines() if line.strip())
                return len(data) if isinstance(data, list) else 1
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None


class _Billing:
    def __init__(self, exp: Experiment, root: Path):
        self.exp, self.root = exp, root
        self.est = exp.cost.estimate
        self.cost = exp.cost
        self.gpus = {**stage_gpus(exp.dump()), **exp.cost.gpus}
        self.slots = self.est.parallel_jobs
        self.notes: list[str] = []
        self.rows: list[Row] = []
        # each allocation's seconds, by part: a job's, or a server's with the jobs it serves
        self.durations: dict[str, list[float]] = {p: [] for p in PARTS}
        # Snakemake jobs of the parts whose allocations are not one job each (servers' clients and
        # the servers' own jobs); the others' are their durations
        self.jobs: dict[str, int] = dict.fromkeys(("generation", "evaluation"), 0)
        self.at_least: dict[str, float] = dict.fromkeys(PARTS, 0.0)  # e.g. a daily API budget
        # each training job's memory per GPU (by phase name, "" for one run): its terms in GB
        self.memory: dict[str, dict[str, Any]] = {}
        # the staged loader's quantisation, in seconds, by layout
        self.quantising: dict[Layout, float] = {}

    # --- figures -----------------------------------------------------------------------------

    def _per(self, figure: Any, key: str) -> Any:
        # a figure for every effort/benchmark, or one per key (bill() checks coverage)
        return figure[key] if isinstance(figure, dict) else figure

    def model_of(self, role: str) -> str | None:
        """The model a job of ``role`` (student, or a teacher's name) holds, as
        cost.estimate.models names it: the student's pretrained id, a teacher's server model_path
        (else its model); None for a student built from scratch."""
        if role == "student":
            return self.exp.student.pretrained
        spec = self.exp.teachers[role].dump()
        return (spec.get("server") or {}).get("model_path") or spec.get("model")

    def figure(self, model: str | None, key: str) -> Any:
        """A throughput of ``model``'s jobs: its own under cost.estimate.models, else
        cost.estimate's."""
        own = self.est.models.get(model) if model else None
        value = getattr(own, key) if own else None
        return getattr(self.est, key) if value is None else value

    def teacher_tokens(self, effort: str) -> float:
        """Mean output tokens of a sample at ``effort``, capped by its own teacher's max_tokens."""
        spec = self.exp.teachers[self.exp.generation.teacher_of(effort)]
        tokens = self._per(self.est.teacher_output_tokens, effort)
        cap = getattr(getattr(spec, "sampling", None), "max_tokens", None)
        return float(min(tokens, cap) if cap else tokens)

    def _path(self, path: str) -> Path:
        return Path(path) if Path(path).is_absolute() else self.root / path

    # --- counts ------------------------------------------------------------------------------

    def pool_prompts(self) -> int:
        """Prompts of the pool: each source's rows (its limit, count, local file or configured
        rows), less the held-out splits carved from them. Echo sources are contamination that
        decontamination drops, by design."""
        total = 0
        for i, s in enumerate(self.exp.sources):
            if s.kind in ("arithmetic", "choice"):
                total += s.count
            elif s.kind == "jsonl":
                total += count_rows(self._path(s.path))
            elif s.kind == "kernels":
                total += self._kernel_problems(s)
            elif s.kind == "dataset":
                rows = self.est.source_rows.get(s.name)
                if rows is None and s.local:
                    rows = count_rows(self._path(s.path))
                if rows is None and s.limit is None:
                    raise EstimateError(
                        f"cost.estimate.source_rows.{s.name}: sources.{i} ({s.path}) is a hub "
                        "dataset without a limit, whose size is not known offline: give the rows "
                        "it yields (after its where filter), or a limit"
                    )
                total += min(x for x in (rows, s.limit) if x is not None)
        pool = total - self.exp.heldout.size - self.exp.heldout.dev_size
        if pool <= 0:
            raise EstimateError(
                f"sources: {total} prompts, all taken by the held-out splits (heldout.size "
                f"{self.exp.heldout.size} + dev_size {self.exp.heldout.dev_size}): no pool left"
            )
        return pool

    def _kernel_problems(self, source: KernelSource) -> int:
        if source.problems:
            return len(source.problems)
        if source.path:  # JSONL rows, one problem each
            return count_rows(self._path(source.path))
        # the project's set, the files of dir, or a generated family
        from ..kernels.problemset import problem_count

        spec = source.dump()
        if source.dir:
            spec["dir"] = str(self._path(source.dir))
        return problem_count(spec)

    def benchmark_problems(self, name: str) -> int:
        if name == "train":
            return self.pool_prompts()
        if name in SPLITS:
            return self.exp.heldout.size if name == "heldout" else self.exp.heldout.dev_size
        bench = self.exp.benchmarks[name]
        rows = self.est.benchmark_sizes.get(name)
        if isinstance(bench, str):
            return rows or count_rows(self._path(bench))
        if rows is None and bench.local:
            rows = count_rows(self._path(bench.path))
        if rows is not None or bench.limit:
            return min(x for x in (rows, bench.limit) if x is not None)
        raise EstimateError(
            f"cost.estimate.benchmark_sizes.{name}: benchmarks.{name} ({bench.path}) is a hub "
            "dataset, whose size is not known offline: give its number of problems"
        )

    # --- parts -------------------------------------------------------------------------------

    def counts(self) -> tuple[int, dict[str, int]]:
        """The pool's prompts and each evaluated benchmark's problems; every missing size named at
        once."""
        missing, problems = [], {}
        pool = 0
        try:
            pool = self.pool_prompts()
        except EstimateError as exc:
            missing.append(str(exc))
        for b in self.exp.evaluated:
            try:
                problems[b] = self.benchmark_problems(b)
            except EstimateError as exc:
                missing.append(str(exc))
        if missing:
            raise EstimateError("cannot estimate:\n  " + "\n  ".join(missing))
        return pool, problems

    def architecture(self, model: str, role: str = "") -> Architecture | None:
        """``model``'s shape: its figures' architecture, a local model's config.json, or the
        shape a student built from scratch is built with; None when none is known."""
        own = self.est.models.get(model) if model else None
        if own is not None and own.architecture is not None:
            return own.architecture
        if model and (self._path(model) / "config.json").is_file():
            return architecture_of(self._path(model))
        shape, tokenizer = self.exp.student.model, self.exp.student.tokenizer
        if role == "student" and shape is not None and tokenizer is not None:
            fields = Architecture.model_fields
            keys = {k: v for k, v in shape.dump().items() if k in fields and v is not None}
            if keys.get("num_experts"):
                keys.pop("intermediate_size")
            return Architecture.parse({**keys, "vocab_size": tokenizer.vocab_size})
        return None

    def training_memory(self, a: Architecture, layout: Layout) -> tuple[dict[str, float], str]:
        """Bytes per GPU of a training job of ``layout`` on a model of shape ``a``, by term, and
        how one copy of the model is spread: a device map's GPUs each hold their layers (and the
        one computing holds a layer's activations and the loss), FSDP2's ranks each a shard
        and their own micro-batch's activations, a replica all of it."""
        train = self.exp.train
        part = parameters(a)
        total = sum(part.values())
        layers = a.num_hidden_layers
        # the compute dtype on GPU is bf16; weights are stored as _dtype (runtime/sft.py) says
        c = 2.0
        stored = 4.0 if train.dtype == "float32" or train.method == "full" else 2.0
        if train.device_map is not None:
            copy, how = layout.gpus_per_node, f"a device map over {layout.gpus_per_node} GPUs"
        elif layout.world_size > 1 and (not train.load_in_4bit or train.quantize_moe_experts):
            copy, how = layout.fsdp_size, f"FSDP2 shards over {layout.fsdp_size} GPUs"
        else:
            copy, how = 1, "a whole copy on each GPU"
        ep = layout.expert_parallel_size
        terms: dict[str, float] = {}
        optim = optimizer_bytes(train.optim)
        if train.method == "full":
            terms["weights (float32)"] = total * 4 / copy
            terms["gradients (float32)"] = total * 4 / copy
            terms[f"optimizer state ({train.optim}, {optim:g} B a weight)"] = total * optim / copy
            gathered = (total - part["embeddings"]) / layers * c  # mixed precision: bf16
        else:
            # bitsandbytes quantises nn.Linear layers (attention, a dense MLP); the staged loader
            # the fused experts too; the rest stays in the storage dtype
            nf4 = {
                "attention": train.load_in_4bit,
                "mlp": train.quantize_moe_experts or (train.load_in_4bit and not a.num_experts),
            }
            held = {k: n * (NF4_BYTES if nf4.get(k) else stored) for k, n in part.items()}
            experts = held["mlp"] if a.num_experts else 0.0
            what = ", ".join(k for k, v in nf4.items() if v) or "none"
            # expert parallelism: each rank holds its experts whole, FSDP2 shards the rest
            terms[f"frozen base (in NF4: {what}; the rest {stored:g} B a weight)"] = (
                experts / (ep if ep > 1 else copy) + (sum(held.values()) - experts) / copy
            )
            n = lora_parameters(a, train.lora)
            terms[f"LoRA weights (float32, {n / 1e6:,.0f}M)"] = n * 4 / copy
            terms["LoRA gradients (float32)"] = n * 4 / copy
            terms[f"optimizer state ({train.optim}, {optim:g} B a weight)"] = n * optim / copy
            gathered = sum(held.values()) - held["embeddings"] - (experts if ep > 1 else 0.0)
            gathered /= layers
        if copy > 1 and train.device_map is None:
            # FSDP2 gathers a layer's weights to compute it, and prefetches the next
            terms["FSDP2's gathered layers (one and the next)"] = 2 * gathered
        for name, n in activation_bytes(a, train, c).items():
            # a device map's GPUs hold their own layers' inputs
            spread = copy if train.device_map is not None and name.startswith("layer inputs") else 1
            terms[f"{name}, {train.batch_size} x {train.max_length} tokens"] = n / spread
        return terms, how

    def quantising_s(self, layout: Layout) -> float:
        """Seconds the staged loader (quantize_moe_experts) spends quantising the student to NF4:
        its attention and MLP weights over the processes that share the work (an FSDP2 shard
        group; one device-map process alone), at cost.estimate.nf4_params_per_s each."""
        if not self.exp.train.quantize_moe_experts:
            return 0.0
        student = self.model_of("student")
        a = self.architecture(student, "student")
        if a is None:
            raise EstimateError(
                f"cost.estimate.models.{student}.architecture: the staged loader's "
                "quantisation is billed from the model's attention and MLP parameters"
            )
        part = parameters(a)
        sharing = layout.fsdp_size if self.exp.train.device_map is None else 1
        quantised = part["attention"] + part["mlp"]
        rate = self.figure(student, "nf4_params_per_s")
        seconds = quantised / (rate * sharing)
        if layout not in self.quantising:
            self.notes.append(
                f"train: the staged loader quantises {quantised / 1e9:,.1f}B weights of "
                f"{student or 'the student'} to NF4 at {rate:,.3g} a second per process "
                f"(cost.estimate.nf4_params_per_s) over {sharing} process"
                f"{'es' if sharing > 1 else ''}: {_duration(seconds)} of each job's start, "
                "besides train_start_s"
            )
        self.quantising[layout] = seconds
        return seconds

    def memory_problems(self) -> list[str]:
        """Every GPU job whose GPUs cannot hold what it needs. A served model: its weights' bytes
        against the GPUs that hold it. A training job: per GPU, its weights, adapter, gradients,
        optimizer state and activations (``training_memory``, from the model's architecture).
        Each against memory per GPU x cost.estimate.memory_fraction. Checked once
        cost.estimate.models gives any model."""
        est, cost, exp = self.est, self.cost, self.exp
        if not est.models:
            return []
        problems: list[str] = []
        train, student = exp.train, self.model_of("student")
        # (rule, what, model, GPUs holding one copy, bytes per parameter or None: as served)
        jobs: list[tuple[str, str, str | None, int, tuple[float, str] | None]] = []
        for teacher in exp.generation.used_teachers:
            key = gpu_key(exp.generation, teacher)
            jobs.append((key, "job", self.model_of(teacher), self.gpus.get(key, 0), None))
        if exp.grpo:
            layout = exp.grpo.layout
            jobs.append(
                (
                    "grpo",
                    "job",
                    student,
                    layout.fsdp_size if exp.grpo.sharded else 1,
                    (16.0, "float32 weights, gradients, two Adam moments"),
                )
            )
        for rule in ("evaluate", "evaluate_budget", "evaluate_effort"):
            jobs.append((rule, "job", student, self.gpus.get(rule, 0), None))
        trainings = [(phase, train.phase_layout(phase)) for phase in train.phases or [None]]
        for rule, what, model, gpus, per_param in [
            *jobs,
            *(("train", phase, student, layout.world_size, None) for phase, layout in trainings),
        ]:
            if not gpus or model is None:
                continue
            figures = est.models.get(model)
            if figures is None:
                problems.append(
                    f"cost.estimate.models: no figures for model {model} ({rule}'s jobs hold "
                    "it): give its params_b, and throughputs where they differ"
                )
                continue
            kind = cost.gpu_type_of(rule)
            if kind is None:
                problems.append(
                    f"cost.gpu_types: the memory of {rule}'s GPUs is needed to check that they "
                    f"hold {model} (cost.estimate.models)"
                )
                continue
            memory = cost.gpu_types[kind].memory_gb
            room = memory * est.memory_fraction
            if rule == "train":
                problems += self._training_problem(what, model, figures, kind, memory)
                continue
            per_param = per_param or (figures.serve_bytes_per_param, "as served")
            need = figures.params_b * per_param[0]  # GB
            if need > gpus * room:
                problems.append(
                    f"{rule}: the {what} cannot hold {model}: {figures.params_b:g}B parameters x "
                    f"{per_param[0]:g} bytes ({per_param[1]}) = {need:,.0f} GB, more than "
                    f"{est.memory_fraction:.0%} (cost.estimate.memory_fraction) of {gpus} x "
                    f"{memory:g} GB ({kind}) = {gpus * room:,.0f} GB"
                )
        return list(dict.fromkeys(problems))

    def _training_problem(
        self, phase: TrainPhase | None, model: str, figures: ModelFigures, kind: str, memory: float
    ) -> list[str]:
        """Why a training job (of ``phase``) cannot run on its GPUs, if it cannot."""
        est, train = self.est, self.exp.train
        layout = train.phase_layout(phase)
        where = f"cost.estimate.models.{model}"
        a = self.architecture(model, "student")
        if a is None:
            return [
                f"{where}.architecture: the training memory estimate needs the model's shape "
                "(hidden_size, num_hidden_layers, heads, head_dim, vocab_size, its MLP or "
                "experts), from its config.json"
            ]
        counted = sum(parameters(a).values()) / 1e9
        if figures.architecture is not None and abs(counted / figures.params_b - 1) > 0.05:
            return [
                f"{where}: its architecture has {counted:,.1f}B parameters but params_b says "
                f"{figures.params_b:g}B: one of them is wrong"
            ]
        terms, how = self.training_memory(a, layout)
        need = sum(terms.values()) / GB
        room = memory * est.memory_fraction
        what = f"phase {phase.name}'s job" if phase else "job"
        self.memory[phase.name if phase else ""] = {"need_gb": need, "room_gb": room, "how": how}
        self.memory[phase.name if phase else ""]["terms_gb"] = {k: v / GB for k, v in terms.items()}
        if need <= room:
            return []
        return [
            f"train: the {what} ({layout.nodes} x {layout.gpus_per_node} GPUs, {how}) needs "
            f"{need:,.1f} GB per GPU for {model}, more than {est.memory_fraction:.0%} "
            f"(cost.estimate.memory_fraction) of {memory:g} GB ({kind}) = {room:,.1f} GB: "
            + "; ".join(f"{k} {v / GB:,.1f} GB" for k, v in terms.items())
        ]

    def run(self) -> Bill:
        gen, exp = self.exp.generation, self.exp
        pool, problems = self.counts()
        refused = self.memory_problems()
        if refused:
            raise EstimateError("cannot estimate:\n  " + "\n  ".join(refused))
        prompts = {e: pool * gen.shards_of(e) / gen.shards for e in gen.efforts}
        k = gen.samples_per_prompt
        correct = {e: self._per(self.est.correct_fraction, e) for e in gen.efforts}
        # the dataset's rows per effort by selection: one trace per prompt with a correct one, every
        # correct trace, or every trace
        one = {e: prompts[e] * (1 - (1 - correct[e]) ** k) for e in gen.efforts}
        selected = {
            "all": {e: prompts[e] * k * correct[e] for e in gen.efforts},
            "unfiltered": {e: prompts[e] * k for e in gen.efforts},
        }
        rows = selected.get(exp.dataset.select, one)
        self.generation(prompts)
        self.training(rows, {s: selected.get(s, one) for s in exp.dataset.ablation})
        self.merges()
        self.evaluation(problems)
        inputs = {
            "pool_prompts": pool,
            "shards": gen.shards,
            "samples_per_prompt": k,
            "prompts_per_effort": {e: round(n) for e, n in prompts.items()},
            "dataset_rows": {e: round(n) for e, n in rows.items()},
            "benchmark_problems": problems,
            "gpu_hour_usd": self.cost.gpu_hour_usd,
            "gpu_types": {k: t.dump() for k, t in self.cost.gpu_types.items()},
            "gpu_type_by_rule": {r: self.cost.gpu_type_of(r) for r in self.gpus},
            "gpus": self.gpus,
            "figures": self.est.dump(),
            "train_memory": self.memory,
        }
        parts = {}
        for part in PARTS:
            rs = [r for r in self.rows if r.part == part]
            if not rs:
                continue
            parts[part] = {
                "jobs": self.jobs.get(part, len(self.durations[part])),
                "gpu_hours": sum(r.gpu_hours for r in rs),
                "job_hours": sum(r.job_hours for r in rs),
                "wall_s": self.wall[part],
                "gpu_usd": sum(r.gpu_usd for r in rs),
                "api_usd": sum(r.api_usd for r in rs),
                "usd": sum(r.usd for r in rs),
            }
            started = [r for r in rs if "starts" in r.detail]
            if started:
                # the models' start-ups (servers or in-process loads): their count and share
                parts[part]["starts"] = sum(r.detail["starts"] for r in started)
                parts[part]["start_gpu_hours"] = sum(r.gpu_hours for r in started)
                parts[part]["start_usd"] = sum(r.gpu_usd for r in started)
            out = [r.tokens for r in rs if r.tokens_kind == "output"]
            if out:
                parts[part]["output_tokens"] = sum(out)
        total = {
            key: sum(t[key] for t in parts.values())
            for key in ("jobs", "gpu_hours", "job_hours", "wall_s", "gpu_usd", "api_usd", "usd")
        }
        total["generation_training_usd"] = sum(
            parts.get(part, {}).get("usd", 0.0) for part in ("generation", "training")
        )
        self.notes += self.figure_notes()
        return Bill(exp.experiment, inputs, self.rows, parts, total, self.notes)

    def figure_notes(self) -> list[str]:
        """Whose figures the jobs were billed at, and which figures are assumptions."""
        notes = []
        for role in ("student", self.exp.generation.teacher):
            model = self.model_of(role)
            own = self.est.models.get(model) if model else None
            if own:
                given = [k for k in ModelFigures.model_fields if getattr(own, k) is not None]
                shape = ("params_b", "serve_bytes_per_param", "architecture", "assumed")
                given = [k for k in given if k not in shape]
                notes.append(
                    f"{role} {model}: {own.params_b:g}B parameters"
                    + (f"; {', '.join(given)} its own" if given else "")
                    + f" (cost.estimate.models.{model})"
                )
        assumed = self.est.assumptions("cost.estimate")
        for model, own in self.est.models.items():
            assumed += own.assumptions(f"cost.estimate.models.{model}")
        for kind, t in self.cost.gpu_types.items():
            assumed += t.assumptions(f"cost.gpu_types.{kind}")
        if assumed:
            notes.append("Assumed, not measured or reported: " + "; ".join(assumed))
        return notes

    @property
    def wall(self) -> dict[str, float]:
        # training's jobs (train.phases among them) one after another; the other parts' at once
        # (up to slots)
        return {
            p: max(self.at_least[p], sum(d) if p == "training" else makespan(d, self.slots))
            for p, d in self.durations.items()
        }

    def _gpu_row(
        self,
        part: str,
        rule: str,
        label: str,
        seconds: list[float],
        gpus: int | None = None,
        **kw: Any,
    ) -> Row:
        gpus = self.gpus.get(rule, 0) if gpus is None else gpus
        job_hours = sum(seconds) / 3600
        return Row(
            part=part,
            rule=rule,
            label=label,
            jobs=len(seconds),
            gpus_per_job=gpus,
            gpu_hours=job_hours * gpus,
            job_hours=job_hours,
            wall_s=sum(seconds) if part == "training" else makespan(seconds, self.slots),
            gpu_usd=job_hours * gpus * self.cost.gpu_rate(rule),
            **kw,
        )

    def generation(self, prompts: dict[str, float]) -> None:
        for teacher in self.exp.generation.used_teachers:
            self.teacher_generation(teacher, prompts)

    def teacher_generation(self, name: str, prompts: dict[str, float]) -> None:
        """The generation jobs of one teacher, at its own spec: its GPUs, backend, throughput and
        start (cost.estimate.models' figures of its model), sampling cap, price and budget.

        A served teacher (sglang) starts once per server (stillroom/plan/generation.py
        teacher_servers, rules/serve.smk) and serves its shards' jobs, of every effort key, in that
        server's allocation: an allocation holds its GPUs for the start and its clients' tokens at
        the server's throughput. A teacher in process (hf) loads in each job; an API or the
        procedural stand-in answers at once. The effort rows bill the tokens' time; the start-up
        is a row of its own, so its share is read, not derived."""
        gen, est = self.exp.generation, self.est
        spec = self.exp.teachers[name]
        model = self.model_of(name)
        per_s = self.figure(model, "teacher_tokens_per_s")
        loads = spec.backend in ("sglang", "hf")
        start = self.figure(model, "teacher_start_s") if loads else 0.0
        served = spec.backend == "sglang"
        gpus = self.gpus.get(gpu_key(gen, name), 0)
        price = spec.price
        # seconds of tokens on each allocation: a served teacher's servers, else each job's own
        alloc: dict[str, float] = dict.fromkeys(teacher_servers(gen, name), 0.0) if served else {}
        all_tokens = 0.0
        jobs = 0
        for key, efforts in effort_keys(gen).items():
            if gen.teacher_of(efforts[0]) != name:
                continue
            shards = gen.shards_of(efforts[0])
            jobs += shards
            per_job = {
                e: prompts[e] / shards * gen.samples_per_prompt * self.teacher_tokens(e)
                for e in efforts
            }
            for shard in range(shards):
                where = server_of(gen, shard) if served else f"{key}/{shard}"
                alloc[where] = alloc.get(where, 0.0) + sum(per_job.values()) / per_s
            for e in efforts:
                out = per_job[e] * shards
                inp = prompts[e] * gen.samples_per_prompt * est.prompt_tokens
                all_tokens += out
                others = [o for o in efforts if o != e]
                # the effort's seconds in each allocation (its jobs on the teacher's servers)
                on: dict[str, float] = {}
                for shard in range(shards):
                    where = server_of(gen, shard) if served else str(shard)
                    on[where] = on.get(where, 0.0) + per_job[e] / per_s
                row = self._gpu_row(
                    "generation",
                    RULE,
                    f"{name} · {e}" + (f" (one job with {', '.join(others)})" if others else ""),
                    list(on.values()),
                    gpus,
                    tokens=out,
                    tokens_kind="output",
                    api_usd=(inp * price.input_per_mtok + out * price.output_per_mtok) / 1e6,
                    input_tokens=inp,
                    teacher=name,
                    effort=e,
                    detail={"prompts": round(prompts[e])},
                )
                row.jobs = shards
                row.wall_s = makespan([start + s for s in on.values()], self.slots)
                self.rows.append(row)
        self.jobs["generation"] += jobs + (len(alloc) if served else 0)
        self.durations["generation"] += [start + s for s in alloc.values()]
        if start:
            what = (
                f"{name}: the teacher's start-up, once per server: {_n(len(alloc), 'server')} "
                f"serving its {_n(jobs, 'job')}"
                if served
                else f"{name}: the teacher's start-up, in each of its {_n(jobs, 'job')}"
            )
            self._start_row("generation", RULE, what, len(alloc), start, gpus, teacher=name)
        if backend_gpus(spec.dump()) and (price.input_per_mtok or price.output_per_mtok):
            self.notes.append(
                f"teachers.{name}: runs on the job's own GPUs and has a price: the ledger charges "
                "both its GPU-hours and its tokens (set the price to 0 for a self-hosted teacher)"
            )
        budget = getattr(spec, "budget", None)
        if budget:
            days = all_tokens / budget.daily_output_tokens
            # the budget resets once a day: the last day's share can run at full speed
            floor = max(0.0, math.ceil(days) - 1) * 86400
            if floor > makespan(self.durations["generation"], self.slots):
                self.at_least["generation"] = max(self.at_least["generation"], floor)
                self.notes.append(
                    f"teachers.{name}.budget: {_si(all_tokens)} output tokens at "
                    f"{_si(budget.daily_output_tokens)} a day take {math.ceil(days)} days"
                )

    def _start_row(
        self, part: str, rule: str, what: str, starts: int, start_s: float, gpus: int, **kw: Any
    ) -> None:
        """A row of model starts (servers or in-process loads), each ``start_s`` on ``gpus``."""
        row = self._gpu_row(
            part, rule, what, [start_s] * starts, gpus, tokens=None, tokens_kind="", **kw
        )
        row.detail.update(starts=starts, start_s=start_s)
        self.rows.append(row)

    def training(
        self, rows: dict[str, float], ablation: Mapping[str, dict[str, float]] | None = None
    ) -> None:
        """The fine-tune's train.phases on ``rows`` per effort, then each selection of the dataset
        ablation, one run of train's settings on its own rows (never in phases)."""
        exp, est, train = self.exp, self.est, self.exp.train
        efforts = exp.generation.efforts
        example = {
            e: min(est.prompt_tokens + self.teacher_tokens(e), train.max_length) for e in efforts
        }
        runs: list[tuple[TrainPhase | None, str, dict[str, float]]] = [
            (phase, phase.name if phase else "", rows) for phase in train.phases or [None]
        ]
        runs += [(None, f"select-{s}", r) for s, r in (ablation or {}).items()]
        student = self.model_of("student")
        for phase, name, rows in runs:
            layout = train.phase_layout(phase)
            # a phase with a layout of its own is charged as train-<name>
            # (stillroom/plan/cluster.py)
            gpus = self.gpus.get(f"train-{phase.name}" if phase else "train", self.gpus["train"])
            per_s = self.figure(student, "train_tokens_per_gpu_s") * max(gpus, 1)
            chosen = (phase.efforts if phase else None) or efforts
            epochs = phase.epochs if phase else train.epochs
            tokens = sum(rows[e] * example[e] for e in chosen) * epochs
            n_rows = sum(rows[e] for e in chosen)
            if train.max_steps > 0:
                # a step takes batch_size x grad_accum packed rows on every data-parallel process
                step = train.batch_size * train.grad_accum * layout.world_size * train.max_length
                tokens = min(tokens, train.max_steps * step)
            seconds = self.figure(student, "train_start_s") + self.quantising_s(layout)
            seconds += tokens / per_s
            self.durations["training"].append(seconds)
            label = (
                (f"{name}: " if name else "")
                + f"{epochs:g} epoch{'' if epochs == 1 else 's'} of {n_rows:,.0f} rows "
                + f"({', '.join(chosen)})"
            )
            self.rows.append(
                self._gpu_row(
                    "training",
                    "train",
                    label,
                    [seconds],
                    gpus=gpus,
                    tokens=tokens,
                    tokens_kind="trained",
                )
            )
        if train.method != "full":
            # each run's adapter is merged into its base by a CPU job of its own (rule
            # merge_adapter) before the next phase starts from it: on the training path, no GPUs
            seconds = [self.figure(student, "merge_s")] * len(runs)
            self.durations["training"] += seconds
            self.rows.append(
                self._gpu_row(
                    "training",
                    "merge_adapter",
                    f"{train.method} adapter into its base, after each training run",
                    seconds,
                    gpus=0,
                    tokens=None,
                    tokens_kind="",
                )
            )
        if exp.grpo:
            seconds = exp.grpo.max_steps * est.grpo_step_s
            self.durations["training"].append(seconds)
            self.rows.append(
                self._gpu_row(
                    "training",
                    "grpo",
                    f"{exp.grpo.max_steps} steps of {exp.grpo.prompts_per_step} prompts x "
                    f"{exp.grpo.group_size}",
                    [seconds],
                    tokens=None,
                    tokens_kind="",
                )
            )

    def merges(self) -> None:
        ratios = self.exp.merge.ratios
        if not ratios:
            return
        seconds = [self.figure(self.model_of("student"), "merge_s")] * len(ratios)
        self.durations["merge"] += seconds
        self.rows.append(
            self._gpu_row(
                "merge",
                "merge",
                f"ratios {', '.join(f'{r:g}' for r in ratios)}",
                seconds,
                tokens=None,
                tokens_kind="",
            )
        )

    def evaluation(self, problems: dict[str, int]) -> None:
        """Every evaluation job. With eval.backend sglang each evaluated model is one server,
        started once, serving all its jobs (of every rule) in its allocation at the model's
        throughput; with hf each job loads its model; an API (openai) starts nothing. The start-ups
        are rows of their own, each model's under the first rule it has jobs of."""
        exp, est, ev = self.exp, self.est, self.exp.eval
        force = ev.budget_force
        student = self.model_of("student")
        loads = ev.backend.backend in ("sglang", "hf")
        start = self.figure(student, "eval_start_s") if loads else 0.0
        served = ev.backend.backend == "sglang"
        per_s = self.figure(student, "eval_tokens_per_s")
        gpus = {}
        models = exp.models
        merges = [m.name for m in exp.model_ids if m.kind == "merge"]
        # seconds of tokens on each allocation: a served model's server, else each job's own
        alloc: dict[str, float] = {}
        starts: dict[str, int] = {}  # rule -> the starts its row carries

        def tokens(bench: str, scale: float = 1.0, budget: int | None = None) -> float:
            t = self._per(est.eval_output_tokens, bench) * scale
            if budget is not None:
                # thinking closed at the budget, then the answer (past max_new_tokens if need be)
                return float(min(t, budget + force.answer_tokens))
            return float(min(t, ev.max_new_tokens))

        def add(rule: str, label: str, jobs: list[tuple[str, str, float]]) -> None:
            # jobs: (model, benchmark, output tokens per sample), one job each
            out = [problems[b] * ev.samples * t for _, b, t in jobs]
            seconds = [o / per_s for o in out]
            on: dict[str, float] = {}
            for i, ((model, _, _), s) in enumerate(zip(jobs, seconds, strict=True)):
                where = model if served else f"{rule}/{i}"
                if where not in alloc:
                    starts[rule] = starts.get(rule, 0) + 1
                alloc[where] = alloc.get(where, 0.0) + s
                on[where] = on.get(where, 0.0) + s
            self.jobs["evaluation"] += len(jobs)
            gpus[rule] = self.gpus.get(rule, 0)
            row = self._gpu_row(
                "evaluation", rule, label, seconds, tokens=sum(out), tokens_kind="output"
            )
            row.wall_s = makespan([start + s for s in on.values()], self.slots)
            self.rows.append(row)

        reported = [(m, b, tokens(b)) for m in models for b in ev.benchmarks]
        select_on = exp.merge.select_on
        dev = [(m, select_on, tokens(select_on)) for m in merges] if select_on else []
        label = f"{_n(len(models), 'model')} x {_n(len(ev.benchmarks), 'benchmark')}"
        if dev:
            label += f" + {_n(len(merges), 'merge')} x {select_on}"
        add("evaluate", label, reported + dev)
        if force:
            b_models = force.models or models
            b_benches = force.benchmarks or ev.benchmarks
            add(
                "evaluate_budget",
                f"{_n(len(b_models), 'model')} x {_n(len(b_benches), 'benchmark')} x "
                f"{_n(len(force.budgets), 'budget')}",
                [
                    (m, b, tokens(b, budget=budget))
                    for m in b_models
                    for b in b_benches
                    for budget in force.budgets
                ],
            )
        per = ev.per_effort
        if per:
            efforts = exp.generation.efforts
            reference = self.teacher_tokens(per.reference)
            benches = per.benchmarks or ev.benchmarks
            add(
                "evaluate_effort",
                f"{_n(len(per.models), 'model')} x {_n(len(benches), 'benchmark')} x "
                f"{_n(len(efforts), 'effort')}",
                [
                    (m, b, tokens(b, scale=self.teacher_tokens(e) / reference))
                    for m in per.models
                    for b in benches
                    for e in efforts
                ],
            )
        self.durations["evaluation"] += [start + s for s in alloc.values()]
        if served:
            self.jobs["evaluation"] += len(alloc)
        for rule, n in starts.items():
            if start:
                what = (
                    f"the models' start-up, one server per model: {_n(n, 'server')}, each "
                    "serving all its model's evaluation jobs"
                    if served
                    else f"the model's start-up, in each of {_n(n, 'job')}"
                )
                self._start_row("evaluation", rule, what, n, start, gpus[rule])


def student_parameters(exp: Experiment, root: str | Path = ".") -> float | None:
    """The student's parameters: cost.estimate.models' params_b for its pretrained id, else counted
    from its architecture (those figures', a local config.json, or the shape it is built with from
    scratch); None where the config knows none of them."""
    billing = _Billing(exp, Path(root))
    own = billing.est.models.get(exp.student.pretrained) if exp.student.pretrained else None
    if own is not None:
        return own.params_b * 1e9
    arch = billing.architecture(exp.student.pretrained, "student")
    return None if arch is None else float(sum(parameters(arch).values()))
