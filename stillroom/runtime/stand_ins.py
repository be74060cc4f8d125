"""Stand-ins for a recipe's hub models, so that its exact structure runs offline in minutes.

The student stand-in is a tiny random-weight Qwen3 saved the way the hub ships Qwen3 base models:
Qwen3's special tokens (``<|endoftext|>`` as end of text and padding, ``<|im_start|>`` and
``<|im_end|>`` as turn markers, ``<think>``/``</think>`` as plain added tokens) and Qwen3's real
chat template, the one without ``{% generation %}`` markers. The teacher stand-in is a tiny Qwen3
trained until it has memorised a correct worked answer to every prompt of the recipe's sources,
so the teacher's server (a real OpenAI-compatible one standing in for SGLang) returns traces that
grading accepts and the dataset is not empty. Neither is a model of anything: they carry the
recipe's formats, not its abilities.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import ModelShape
from ..grading.formats import user_content
from ..io import DataError, atomic_dir
from .saving import save_pretrained

QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK = ["<think>", "</think>"]
SHAPE = {
    "family": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}


def qwen3_template() -> str:
    """Qwen3's serving chat template as TRL ships it (no generation markers)."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text(
        encoding="utf-8"
    )


def answer_for(record: Mapping[str, Any]) -> str:
    """The teacher stand-in's worked answer: a short reasoning block and the boxed gold."""
    first = record["prompt"].strip().splitlines()[0]
    return (
        f"<think>\nThe question: {first}\nWorking it through, the answer is {record['answer']}."
        f"\n</think>\n\nThe answer is \\boxed{{{record['answer']}}}."
    )


def qwen3_tokenizer(texts: Sequence[str], *, vocab_size: int, eos: str):
    """A byte-level BPE trained on ``texts`` with Qwen3's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AddedToken, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainer=trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=QWEN3_SPECIAL,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=eos,
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=qwen3_template(),
        model_max_length=SHAPE["max_position_embeddings"],
    )
    # As in Qwen3's tokenizer: the reasoning markers are added tokens that decoding keeps.
    hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
    return hf


def _model(tokenizer, eos_ids: list[int], seed: int):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from .student import model_config

    torch.manual_seed(seed)
    net = AutoModelForCausalLM.from_config(
        model_config(tokenizer, ModelShape.parse(SHAPE, where="stand-in"))
    )
    net.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return net


def memorise(net, tokenizer, records: Sequence[Mapping[str, Any]], *, steps: int, seed: int):
    """Train ``net`` on each record's chat prompt followed by its worked answer (loss on the
    answer only) and return (final loss, fraction of prompts answered exactly under greedy
    decoding)."""
    import torch

    rows = []
    for rec in records:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": user_content(rec)}],
            add_generation_prompt=True,
            tokenize=False,
        )
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer_for(rec) + "<|im_end|>", add_special_tokens=False)["input_ids"]
        rows.append((p, a))
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    pad = tokenizer.pad_token_id
    net.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        batch = rng.sample(rows, min(16, len(rows)))
        width = max(len(p) + len(a) for p, a in batch)
        ids = torch.tensor([p + a + [pad] * (width - len(p) - len(a)) for p, a in batch])
        labels = torch.tensor(
            [[-100] * len(p) + a + [-100] * (width - len(p) - len(a)) for p, a in batch]
        )
        mask = (labels != -100) | (
            torch.arange(width)[None, :] < torch.tensor([[len(p)] for p, _ in batch])
        )
        loss = net(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    net.eval()
    exact = 0
    with torch.no_grad():
        for p, a in rows:
            out = net.generate(input_ids=torch.tensor([p]), max_new_tokens=len(a), do_sample=False)[
                0, len(p) :
            ].tolist()
            exact += out == a
    return loss.item(), exact / len(rows)


def build(
    records: Sequence[Mapping[str, Any]],
    *,
    student_dir: str | os.PathLike,
    teacher_dir: str | os.PathLike,
    vocab_size: int = 1024,
    steps: int = 600,
    seed: int = 0,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Save the student and teacher stand-ins (module docstring); the teacher memorises
    ``records`` (pool records: prompt, answer, kind)."""
    texts = [user_content(r) for r in records] + [answer_for(r) for r in records]
    # The student ends its text with <|endoftext|>, as a base model does; training teaches it to
    # end a turn with <|im_end|>. The teacher, like an instruct model, stops at either.
    student_tok = qwen3_tokenizer(texts, vocab_size=vocab_size, eos="<|endoftext|>")
    teacher_tok = qwen3_tokenizer(texts, vocab_size=vocab_size, eos="<|im_end|>")
    ends = student_tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    student = _model(student_tok, [student_tok.eos_token_id], seed)
    with atomic_dir(student_dir) as tmp:
        save_pretrained(student, tmp)
        save_pretrained(student_tok, tmp)
    teacher = _model(teacher_tok, ends, seed + 1)
    loss, exact = memorise(teacher, teacher_tok, records, steps=steps, seed=seed)
    with atomic_dir(teacher_dir) as tmp:
        save_pretrained(teacher, tmp)
        save_pretrained(teacher_tok, tmp)
    log(
        f"stand-ins: student {student_dir}, teacher {teacher_dir} "
        f"({len(records)} prompts memorised: loss {loss:.3f}, {exact:.0%} exact under greedy)"
    )
    return {"prompts": len(records), "teacher_loss": loss, "teacher_exact": exact}


def build_for_config(paths: Sequence[str], root: str | os.PathLike = ".") -> dict[str, Any]:
    """The stand-ins a recipe config names: its ``student.pretrained`` directory and its
    generation teacher's served ``model_path``, the teacher memorising the config's sources."""
    from ..config import load_yaml, merge_configs
    from ..config.experiment import Experiment
    from ..data.sources import iter_sources

    merged: dict[str, Any] = {}
    for path in paths:
        merged = merge_configs(merged, load_yaml(path))
    exp = Experiment.parse(merged)
    root = Path(root)

    def local(key: str, value: str | None) -> Path:
        if not value:
            raise DataError(f"{key} must name a local directory to build the stand-in into")
        return Path(value) if Path(value).is_absolute() else root / value

    teacher = exp.teachers[exp.generation.teacher]
    server = getattr(teacher, "server", None)
    extra = (server.model_extra or {}) if server else {}
    if "model_path" not in extra:
        raise DataError(
            f"teachers.{exp.generation.teacher} must be served from a command with a "
            "server.model_path to build the teacher stand-in into"
        )
    student_dir = local("student.pretrained", exp.student.pretrained)
    teacher_dir = local(f"teachers.{exp.generation.teacher}.server.model_path", extra["model_path"])
    # the teacher memorises the sources' prompts: they must be files here, never a hub download
    hub = [
        f"sources.{i}.path ({s.path})"
        for i, s in enumerate(exp.sources)
        if s.kind == "dataset" and not s.local
    ]
    if hub:
        raise DataError(
            f"stand-ins are for configs whose sources are local files; {', '.join(hub)} "
            "name hub datasets (a smoke twin points them at small local copies)"
        )
    sources = [
        s.model_copy(update={"path": str(root / s.path)})
        if getattr(s, "local", False) and not Path(s.path).is_absolute()
        else s
        for s in exp.sources
    ]
    records = list(iter_sources(sources, {}, exp.seed))
    return build(
        records,
        student_dir=student_dir,
        teacher_dir=teacher_dir,
        seed=exp.seed,
    )
