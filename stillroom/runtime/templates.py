"""The chat template a student is trained with, and the tokens it is trained on.

Assistant-only loss needs ``{% generation %}`` markers around each assistant turn. Real models'
serving templates rarely have them (Qwen3, Llama 3 and DeepSeek-R1's do not), and some drop the
reasoning of a turn (DeepSeek-R1's renders only the text after ``</think>``). The template is the
model's own when it has markers, else the one ``train.chat_template`` names, else TRL's training
variant of a template TRL knows. The saved checkpoint keeps the model's own template: it is what
serves the model.

The supervised tokens are exactly what the model writes at inference: each assistant turn inside
the markers, less a leading part the serving template's generation prompt already supplies
(DeepSeek-R1's ``<｜Assistant｜><think>\\n``) and less whitespace after the end-of-turn token
(Qwen3's newline after ``<|im_end|>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..io import DataError

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
PROBE = [{"role": "user", "content": "x"}]  # a conversation to find the generation prompt with


def has_markers(template: str | None) -> bool:
    return bool(template and GENERATION.search(template))


def unmarked(path) -> str:
    return (
        f"train.chat_template: {path} has no {{% generation %}} markers around the assistant "
        "turns, so assistant-only loss would train on nothing"
    )


def serving_template(tokenizer, where: str = "the student") -> str:
    """The tokenizer's own chat template (the default of a set of named ones)."""
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        raise DataError(f"{where}: the tokenizer has no chat template to render conversations with")
    return template


@dataclass(frozen=True)
class TrainingTemplate:
    text: str
    origin: str  # "model" (its own), "trl" (TRL's training variant), or the configured file
    prompt_header: str  # what the serving template's generation prompt appends

    def encode(self, tokenizer, messages: list[dict]) -> dict[str, list[int]]:
        """``input_ids`` and ``assistant_masks`` of one conversation (module docstring)."""
        text = tokenizer.apply_chat_template(messages, chat_template=self.text, tokenize=False)
        enc = tokenizer.apply_chat_template(
            messages,
            chat_template=self.text,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
        offsets = enc.encodings[0].offsets
        start = 0
        while start < len(mask):
            if not mask[start]:
                start += 1
                continue
            end = start
            while end < len(mask) and mask[end]:
                end += 1
            self._trim(text, offsets, mask, start, end)
            start = end
        return {"input_ids": ids, "assistant_masks": mask}

    def end_of_turn(self, tokenizer) -> int | None:
        """The token that closes an assistant turn: the last supervised one of a probe reply."""
        probe = [*PROBE, {"role": "assistant", "content": "y"}]
        enc = self.encode(tokenizer, probe)
        ids = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
        return ids[-1] if ids else None

    def _trim(self, text: str, offsets, mask: list[int], start: int, end: int) -> None:
        """Unmask the run [start, end)'s leading tokens when the run opens with the generation
        prompt, and its trailing whitespace-only tokens."""
        first = offsets[start][0]
        if self.prompt_header and text.startswith(self.prompt_header, first):
            for i in range(start, end):
                if offsets[i][1] > first + len(self.prompt_header):
                    break
                mask[i] = 0
        for i in range(end - 1, start - 1, -1):
            if not mask[i] or text[offsets[i][0] : offsets[i][1]].strip():
                break
            mask[i] = 0


def prompt_header(tokenizer, serving: str) -> str:
    """What the serving template appends for the model to answer after a user turn."""
    bare = tokenizer.apply_chat_template(PROBE, chat_template=serving, tokenize=False)
    prompted = tokenizer.apply_chat_template(
        PROBE, chat_template=serving, tokenize=False, add_generation_prompt=True
    )
    return prompted[len(bare) :] if prompted.startswith(bare) else ""


def training_template(
    tokenizer, configured: str | Path | None = None, where: str = "the student"
) -> TrainingTemplate:
    """The template ``tokenizer``'s model trains with (module docstring); a DataError naming the
    cause when there is none."""
    serving = serving_template(tokenizer, where)
    if configured:
        text, origin = Path(configured).read_text(encoding="utf-8"), str(configured)
        if not has_markers(text):
            raise DataError(unmarked(configured))
    elif has_markers(serving):
        text, origin = serving, "model"
    else:
        from trl.chat_template_utils import get_training_chat_template

        try:
            text = get_training_chat_template(tokenizer)
        except ValueError:
            raise DataError(
                f"{where}: its chat template has no {{% generation %}} markers, so assistant-only "
                "loss would train on nothing, and TRL has no training variant of it: set "
                "train.chat_template to a copy of the template with {% generation %} ... "
                "{% endgeneration %} around each assistant turn's reasoning, answer and "
                "end-of-turn token"
            ) from None
        origin = "trl"
    return TrainingTemplate(
        text=text, origin=origin, prompt_header=prompt_header(tokenizer, serving)
    )


def config_problem(pretrained: str | None, configured: str | None, root: Path) -> str | None:
    """Why the configured student could not be trained with assistant-only loss, checked before
    any job: the template file's markers, and a local pretrained student's template (a hub one is
    checked by its train job: nothing is downloaded at DAG build)."""
    full = (
        Path(configured)
        if configured and Path(configured).is_absolute()
        else root / str(configured)
    )
    if configured and full.is_file() and not has_markers(full.read_text(encoding="utf-8")):
        return unmarked(configured)
    local = (
        Path(pretrained)
        if pretrained and Path(pretrained).is_absolute()
        else root / str(pretrained)
    )
    if not (pretrained and local.is_dir()):
        return None
    from transformers import AutoTokenizer

    try:
        training_template(
            AutoTokenizer.from_pretrained(local),
            full if configured else None,
            where=f"student.pretrained ({pretrained})",
        )
    except DataError as exc:
        return str(exc)
    return None
