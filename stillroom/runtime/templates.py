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

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..io import DataError

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
PROBE = [{"role": "user", "content": "x"}]  # a conversation to find the generation prompt with
# The fields a template may read an assistant turn's reasoning from (Qwen3's, DeepSeek's and
# vLLM's reasoning_content; gpt-oss's thinking, rendered in its analysis channel).
REASONING_FIELDS = ("reasoning_content", "thinking")
THINK = re.compile(r"\s*<think>(.*?)</think>(.*)", re.S)
SENTINEL = "Zq7 sentinel reasoning"  # probe text no template writes of its own
# A fragment of template text with this many words is prose, not a marker (rule in ``check``).
PROSE_WORDS = 3
# an identifier ("start_of_turn") or a key=value ("to=user") is one word
WORD = re.compile(r"[^\W\d]\w*(?:=\w+)*")
MAX_SHOWN = 5  # rows named in a refusal


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


def split_reasoning(content: str) -> tuple[str, str]:
    """(reasoning, answer) of an assistant turn written ``<think>reasoning</think>answer``;
    ("", content) without a think block."""
    found = THINK.fullmatch(content)
    return (found[1].strip(), found[2].strip()) if found else ("", content.strip())


@dataclass(frozen=True)
class TrainingTemplate:
    text: str
    origin: str  # "model" (its own), "trl" (TRL's training variant), or the configured file
    prompt_header: str  # what the serving template's generation prompt appends
    name: str = "the chat template"  # how refusals name it
    # the message field the template renders reasoning from, if any; else it stays inline
    reasoning_field: str | None = None
    sha256: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "sha256", hashlib.sha256(self.text.encode()).hexdigest())

    def fed(self, messages: list[dict]) -> list[dict]:
        """``messages`` as the template reads them: an assistant turn's ``<think>`` reasoning
        moved into the template's reasoning field (inline, it would render as answer text)."""
        if not self.reasoning_field:
            return messages
        out = []
        for m in messages:
            reasoning, answer = split_reasoning(m["content"] or "")
            out.append(
                {**m, "content": answer, self.reasoning_field: reasoning}
                if m["role"] == "assistant" and reasoning
                else m
            )
        return out

    def encode(self, tokenizer, messages: list[dict]) -> dict[str, list[int]]:
        """``input_ids`` and ``assistant_masks`` of one conversation (module docstring)."""
        messages = self.fed(messages)
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
                f"{where}: its chat template ({describe(serving)}) has no {{% generation %}} "
                "markers, so assistant-only loss would train on nothing, and TRL has no training "
                "variant of it: set "
                "train.chat_template to a copy of the template with {% generation %} ... "
                "{% endgeneration %} around each assistant turn's reasoning, answer and "
                "end-of-turn token"
            ) from None
        origin = "trl"
    digest = hashlib.sha256(text.encode()).hexdigest()
    names = {
        "model": f"{where}'s own chat template ({describe(text)})",
        "trl": f"the training template ({describe(text)})",
    }
    return TrainingTemplate(
        text=text,
        origin=origin,
        prompt_header=prompt_header(tokenizer, serving),
        name=names.get(origin, f"train.chat_template {origin}, sha256 {digest[:12]}"),
        reasoning_field=reasoning_field(tokenizer, text),
    )


def describe(text: str) -> str:
    """The TRL template file ``text`` is, if it is one, and its hash."""
    import trl

    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    for path in sorted((Path(trl.__file__).parent / "chat_templates").glob("*.jinja")):
        if path.read_text(encoding="utf-8") == text:
            return f"TRL's {path.name}, sha256 {digest}"
    return f"sha256 {digest}"


def reasoning_field(tokenizer, text: str) -> str | None:
    """The field of ``REASONING_FIELDS`` the template renders a turn's reasoning from, found by
    rendering a probe turn with each: templates name and place it in many ways (a field, a
    channel), so the rendering, not the template's name, says which it reads."""
    for name in REASONING_FIELDS:
        probe = [*PROBE, {"role": "assistant", "content": "y", name: SENTINEL}]
        try:
            rendered = tokenizer.apply_chat_template(probe, chat_template=text, tokenize=False)
        # a template that refuses the probe reads no field of it
        except Exception:  # noqa: BLE001
            continue
        if SENTINEL in rendered:
            return name
    return None


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


def check_system_turn(tokenizer, template: TrainingTemplate, examples: list[dict]) -> None:
    """Refuse, naming the template and the fix, a template that raises on the system turn the
    rows carry (Gemma's: "System role not supported")."""
    row = next((ex for ex in examples if ex["messages"][0]["role"] == "system"), None)
    if row is None:
        return
    probe = [*PROBE, {"role": "assistant", "content": "y"}]
    try:
        tokenizer.apply_chat_template(probe, chat_template=template.text, tokenize=False)
    # a template that fails without a system turn too is reported by check_renders
    except Exception:  # noqa: BLE001
        return
    try:
        tokenizer.apply_chat_template(
            [{"role": "system", "content": "x"}, *probe],
            chat_template=template.text,
            tokenize=False,
        )
    # any template failure on a system turn is the refusal to report
    except Exception as exc:  # noqa: BLE001
        raise DataError(
            f"{template.name} refuses a system turn ({type(exc).__name__}: {exc}), and rows "
            f"carry one (row {row['id']}: the effort tag): set student.effort_tag_in: user to put "
            "the tag at the head of the user turn, or train.chat_template to a template that "
            "takes a system turn"
        ) from None


def check_supervision(
    tokenizer,
    template: TrainingTemplate,
    examples: list[dict],
    encoded: list[dict],
    max_length: int,
    sample: int = 256,
) -> dict:
    """Check, on the tokens and masks the trainer will see, that ``template`` supervises each
    assistant turn as the row wrote it; the outcome for provenance, or a DataError naming the
    template, the rows and what went missing or leaked.

    Supervised (decoded) must be: each assistant turn's reasoning, answer and tool calls, in that
    order, and besides them only the template's markers; after a turn's last piece one marker (its
    end-of-turn), or more only where the template writes them between a turn and the next
    (Cohere's ``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>``), never what it writes only at a
    conversation's end (Phi-3's eos after ``<|end|>``), which a served model, stopped at its
    end-of-turn, never generates. Nothing of a system or user turn (the effort tag included) may
    be supervised, and the template may add no text of its own anywhere in the rendering. The rule
    that tells a marker from added text: what is left once the row's own text and the tokenizer's
    special tokens are taken out is a marker while a fragment of it has fewer than
    ``PROSE_WORDS`` words (role and channel names: "assistant", "analysis"); three words or more
    are prose the row never wrote (a default system prompt, "Reasoning effort is set to xhigh"),
    which would teach the student a context it is not served with, or contradict the row.
    """
    specials = sorted(
        {str(t) for t in tokenizer.added_tokens_decoder.values()}
        | set(tokenizer.all_special_tokens),
        key=len,
        reverse=True,
    )
    split = re.compile("|".join([re.escape(t) for t in specials if t] + ["\x00"]))
    # what the template writes between an assistant turn and the next turn
    probe = [*PROBE, {"role": "assistant", "content": SENTINEL}, {"role": "user", "content": "z"}]
    try:
        rendered = tokenizer.apply_chat_template(probe, chat_template=template.text, tokenize=False)
        between = re.sub(r"\s", "", rendered.split(SENTINEL, 1)[1])
    # a template that takes no second turn writes nothing between turns
    except Exception:  # noqa: BLE001
        between = ""
    chosen = _sample(examples, sample)
    bad = []
    for i in chosen:
        problems = _row_problems(
            tokenizer, examples[i]["messages"], encoded[i], split, between, max_length
        )
        if problems:
            bad.append(f"row {examples[i]['id']}: {'; '.join(dict.fromkeys(problems))}")
    if bad:
        more = f" (and {len(bad) - MAX_SHOWN} more rows)" if len(bad) > MAX_SHOWN else ""
        raise DataError(
            f"{template.name} does not train the assistant's turn "
            f"as the rows wrote it, in {len(bad)} of {len(chosen)} rows checked: "
            f"{' | '.join(bad[:MAX_SHOWN])}{more}. Set train.chat_template to a template with "
            "{% generation %} markers around exactly each assistant turn's reasoning, answer and "
            "end-of-turn token, that adds no text of its own"
        )
    return {
        "template": template.name,
        "sha256": template.sha256,
        "reasoning_field": template.reasoning_field,
        "rows_checked": len(chosen),
        "rows": len(examples),
        "passed": True,
    }


def _sample(examples: list[dict], size: int) -> list[int]:
    """Indices of at most ``size`` rows: the first of each kind (effort, tagged, turns, tool
    calls), then evenly spaced others."""
    kinds: dict[tuple, int] = {}
    for i, ex in enumerate(examples):
        roles = tuple(m["role"] for m in ex["messages"])
        calls = any(m.get("tool_calls") for m in ex["messages"])
        kinds.setdefault((ex.get("effort"), ex.get("tagged"), roles, calls), i)
    chosen = set(list(kinds.values())[:size])
    step = max(1, len(examples) // max(1, size - len(chosen)))
    for i in range(0, len(examples), step):
        if len(chosen) >= size:
            break
        chosen.add(i)
    return sorted(chosen)


def _row_text(messages: list[dict]) -> list[str]:
    """Every line of a conversation's own text, longest first: what the check takes out of a
    rendering to see what the template added."""
    parts = []
    for m in messages:
        reasoning, answer = split_reasoning(m["content"] or "")
        parts += [reasoning, answer]
        for call in m.get("tool_calls", []):
            fn = call["function"]
            parts += [fn["name"], *map(str, fn["arguments"]), *map(str, fn["arguments"].values())]
            parts.append(json.dumps(fn["arguments"]))
    lines = {line.strip() for part in parts for line in [part, *part.splitlines()]}
    return sorted((line for line in lines if line), key=len, reverse=True)


def _fragments(text: str, split: re.Pattern) -> list[str]:
    return [f.strip() for f in split.split(text) if f.strip()]


def _prose(fragments: list[str]) -> list[str]:
    return [f for f in fragments if len(WORD.findall(f)) >= PROSE_WORDS]


def _row_problems(
    tokenizer, messages, enc, split: re.Pattern, between: str, max_length: int
) -> list[str]:
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    problems = []
    # a prompt too long of its own is supervision_stats's to report; one the template's text
    # makes too long is the template's fault
    first = runs[0][0] if runs else len(ids)
    head = messages[: next(i for i, m in enumerate(messages) if m["role"] == "assistant")]
    own = len(
        tokenizer("\n".join(m["content"] or "" for m in head), add_special_tokens=False)[
            "input_ids"
        ]
    )
    if first >= max_length > own:
        problems.append(
            f"{first} tokens precede its first supervised token ({own} of them the row's own "
            f"text), more than train.max_length {max_length}: nothing of it would be trained"
        )
    full = tokenizer.decode(ids)
    decoded = [tokenizer.decode(ids[a:b]) for a, b in runs]
    text = "\x00".join(decoded)
    # each assistant turn's pieces in order; what a turn's last piece ends at, by run
    spans, pos = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        reasoning, answer = split_reasoning(m["content"] or "")
        pieces = [("reasoning", reasoning), ("answer", answer)]
        pieces += [
            (f"call to {c['function']['name']}", c["function"]["name"])
            for c in m.get("tool_calls", [])
        ]
        for label, piece in pieces:
            if not piece:
                continue
            at = text.find(piece, pos)
            if at < 0:
                why = (
                    "never rendered"
                    if piece not in full
                    else "rendered out of order"
                    if piece in text
                    else "rendered but not supervised"
                )
                problems.append(f"message {i}'s {label} is {why}")
                continue
            spans.append((at, at + len(piece)))
            pos = at + len(piece)
    residual = list(text)
    for a, b in spans:
        residual[a:b] = ["\x00"] * (b - a)
    residual = "".join(residual)
    for m in messages:
        if m["role"] == "assistant":
            continue
        for line in (m["content"] or "").splitlines():
            if len(line.strip()) >= 4 and line.strip() in residual:
                problems.append(f"its {m['role']} turn's text {line.strip()[:60]!r} is supervised")
    problems += [
        f"text the row never wrote is supervised: {f[:80]!r}"
        for f in _prose(_fragments(residual, split))
    ]
    # after each run's last piece: its end-of-turn marker, or what the template writes between turns
    offset = 0
    for run in decoded:
        end = offset + len(run)
        last = max((e for s, e in spans if offset <= s < end), default=None)
        if last is not None:
            tail = text[last:end]
            markers = len(split.findall(tail)) + len(_fragments(tail, split))
            if markers > 1 and not between.startswith(re.sub(r"\s", "", tail)):
                problems.append(
                    f"more than an end-of-turn marker is supervised after a turn: {tail!r}"
                )
        offset = end + 1
    # text the template adds anywhere: take out the row's own text, then look for prose
    rest = full
    for line in _row_text(messages):
        rest = rest.replace(line, "\x00")
    problems += [
        f"the template adds text of its own: {f[:80]!r}" for f in _prose(_fragments(rest, split))
    ]
    return problems
