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
(Qwen3's newline after ``<|im_end|>``). ``check_supervision`` holds the training template to
that, row by row, against the serving template.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..io import DataError
from .stops import control_token

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
    serving: str  # the serving template (the model's own), which the training one must agree with
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

    def render(self, tokenizer, messages: list[dict]) -> tuple[str, list[int], list[int], list]:
        """One conversation rendered (fed) with the template: its text, tokens, assistant mask as
        the markers give it, and each token's character span in the text."""
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
        return text, ids, mask, enc.encodings[0].offsets

    def encode(self, tokenizer, messages: list[dict]) -> dict[str, list[int]]:
        """``input_ids`` and ``assistant_masks`` of one conversation (module docstring)."""
        text, ids, mask, offsets = self.render(tokenizer, messages)
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

    def end_of_turn(self, tokenizer) -> int:
        """The token that closes an assistant turn: the last supervised one of a probe reply. It
        becomes a stop token of the served model, so it must be a control token (``control_token``);
        a DataError naming what ends the turn otherwise."""
        probe = [*PROBE, {"role": "assistant", "content": "y"}]
        enc = self.encode(tokenizer, probe)
        ids, mask = enc["input_ids"], enc["assistant_masks"]
        supervised = [i for i, bit in enumerate(mask) if bit]
        if supervised and control_token(tokenizer, ids[supervised[-1]]):
            return ids[supervised[-1]]
        if not supervised:
            raise DataError(f"{self.name} supervises no token of an assistant reply")
        last = supervised[-1]
        token, after = tokenizer.decode([ids[last]]), tokenizer.decode(ids[last + 1 :])
        ends = f"an assistant turn's supervision ends in the text token {token!r}"
        closing = next((t for t in ids[last + 1 :] if control_token(tokenizer, t)), None)
        if closing is not None:
            raise DataError(
                f"{self.name}: {ends}, and the end-of-turn token "
                f"{tokenizer.convert_ids_to_tokens(closing)!r} the template writes after it is not "
                "supervised: the model would never learn to stop, and served it would stop at "
                f"every {token!r} it writes. Mark the end-of-turn token inside {{% generation %}} "
                "(train.chat_template)"
            )
        raise DataError(
            f"{self.name}: {ends}, and the template writes no end-of-turn token after an assistant "
            f"turn ({f'it writes {after!r}' if after else 'nothing'} after the reply): a model "
            "trained on it could never learn to stop. Set train.chat_template to a template whose "
            "assistant turns end in a special token of the tokenizer (its eos "
            f"{tokenizer.eos_token!r}) inside {{% generation %}}"
        )

    def _trim(self, text: str, offsets, mask: list[int], start: int, end: int) -> None:
        """Unmask the run [start, end)'s leading tokens when the run opens with the generation
        prompt or the rest of it (Qwen2.5's markers leave ``<|im_start|>assistant`` out and take
        in its ``\\n``), and its trailing whitespace-only tokens."""
        first, header = offsets[start][0], self.prompt_header
        # the length of the prompt's head written before the markers: the fewest that fit
        head = next(
            (
                k
                for k in range(len(header))
                if text.startswith(header[k:], first) and text[:first].endswith(header[:k])
            ),
            None,
        )
        if head is not None:
            for i in range(start, end):
                if offsets[i][1] > first + len(header) - head:
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
        serving=serving,
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
    assistant turn as the row wrote it and as the served model writes it; the outcome for
    provenance, or a DataError naming the template, the rows and what went missing or leaked.

    Against the serving template (``TrainingTemplate.serving``, which serves the checkpoint): the
    training template renders each row as it does, but for the reasoning it drops
    (``_first_difference``); each assistant turn is one span of supervision that starts exactly
    where the serving template's generation prompt for it ends (a space or newline the model
    writes after ``GPT4 Correct Assistant:`` is supervised, the prompt itself is not) and ends in
    a control token (``end_of_turn``), the one the served model stops at.

    Supervised (decoded) must be: each assistant turn's reasoning, answer and tool calls, in that
    order, and besides them only the template's markers; after a turn's last piece one marker (its
    end-of-turn), or more only where the template writes them between a turn and the next
    (Cohere's ``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>``), never what it writes only at a
    conversation's end (Phi-3's eos after ``<|end|>``), which a served model, stopped at its
    end-of-turn, never generates. Nothing of a system or user turn (the effort tag included) may
    be supervised, and the template may add no text of its own anywhere in the rendering. The rule
    that tells structure from added text: what is left once the row's own text, the template's
    role headers (``_structure``: OpenChat's "GPT4 Correct User: ") and the tokenizer's special
    tokens are taken out is a marker while a fragment of it has fewer than ``PROSE_WORDS`` words
    (role and channel names: "assistant", "analysis"); three words or more are prose the row never
    wrote (a default system prompt, "Reasoning effort is set to xhigh"), which would teach the
    student a context it is not served with, or contradict the row.
    """
    end_of_turn = template.end_of_turn(tokenizer)
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
    structure = _structure(tokenizer, template, split)
    chosen = _sample(examples, sample)
    bad = []
    for i in chosen:
        problems = _row_problems(
            tokenizer,
            template,
            examples[i]["messages"],
            encoded[i],
            (split, between, structure),
            max_length,
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
            "end-of-turn token, from where the serving template's generation prompt ends, that "
            "renders the rows as the serving template does and adds no text of its own"
        )
    return {
        "template": template.name,
        "sha256": template.sha256,
        "reasoning_field": template.reasoning_field,
        "end_of_turn": tokenizer.convert_ids_to_tokens(end_of_turn),
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


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """The [start, end) token spans of supervision."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _row_problems(
    tokenizer,
    template: TrainingTemplate,
    messages,
    enc,
    probed: tuple[re.Pattern, str, list[str]],
    max_length: int,
) -> list[str]:
    split, between, structure = probed
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    runs = _runs(mask)
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
    # text the template adds anywhere: take out the row's own text and the template's role
    # headers, then look for prose
    text, rendered_ids, _, offsets = template.render(tokenizer, messages)
    rest = text
    for line in _row_text(messages):
        rest = rest.replace(line, "\x00")
    for header in structure:
        rest = rest.replace(header, "\x00")
    problems += [
        f"the template adds text of its own: {f[:80]!r}" for f in _prose(_fragments(rest, split))
    ]
    if rendered_ids != list(ids):
        return [*problems, "its tokens to train on are not the template's rendering of it"]
    return problems + _turn_problems(
        tokenizer, template, messages, (text, ids, runs, offsets), between
    )


def _turn_problems(tokenizer, template: TrainingTemplate, messages, rendered, between: str):
    """The row against the serving template (``check_supervision``): its rendering, and each
    assistant turn's span of supervision, from the generation prompt to a control token.
    ``rendered``: the training template's text, tokens, spans of supervision and token offsets."""
    text, ids, runs, offsets = rendered
    fed = template.fed(messages)
    turns = [split_reasoning(m["content"] or "") for m in messages if m["role"] == "assistant"]
    try:
        served = tokenizer.apply_chat_template(fed, chat_template=template.serving, tokenize=False)
    # a serving template that cannot render the row is the problem to report
    except Exception as exc:  # noqa: BLE001
        return [f"the serving template fails on it ({type(exc).__name__}: {exc})"]
    problems = []
    differs = _first_difference(served, text, turns)
    # the last turn may close with what the template writes after a turn, before the next: the
    # end-of-turn GLM-4.5's serving template leaves to the next turn (<|user|>)
    if differs and differs[0] == len(served):
        differs = None if between.startswith(re.sub(r"\s", "", text[differs[1] :])) else differs
    if differs:
        problems.append(
            "the training template renders it unlike the serving template: "
            + _show(served, text, *differs)
        )
    where = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if len(runs) != len(where):
        return problems + [
            f"{len(runs)} spans of supervision for its {len(where)} assistant turns (each turn "
            "must be one, from its generation prompt to its end-of-turn token)"
        ]
    for i, (start, end) in zip(where, runs, strict=True):
        prompt = tokenizer.apply_chat_template(
            fed[:i], chat_template=template.serving, tokenize=False, add_generation_prompt=True
        )
        before = text[: offsets[start][0]]
        differs = _first_difference(prompt, before, turns)
        if differs and differs[0] == len(prompt):
            problems.append(
                f"message {i}'s {before[differs[1] :]!r}, which the model writes after the serving "
                f"template's generation prompt ({prompt[-30:]!r}), is not supervised"
            )
        elif differs and differs[1] == len(before):
            problems.append(
                f"message {i}'s supervision starts before the serving template's generation "
                f"prompt ends ({prompt[differs[0] :]!r} is the prompt's, not the model's)"
            )
        elif differs:
            problems.append(
                f"message {i}'s supervision does not follow the serving template's generation "
                f"prompt: {_show(prompt, before, *differs)}"
            )
        if not control_token(tokenizer, ids[end - 1]):
            problems.append(
                f"message {i}'s supervision ends in the text token "
                f"{tokenizer.decode([ids[end - 1]])!r}, not an end-of-turn token"
            )
    return problems


def _show(served: str, trained: str, i: int, j: int) -> str:
    return (
        f"after {served[max(0, i - 30) : i]!r} the serving template writes {served[i : i + 30]!r}, "
        f"the training template {trained[j : j + 30]!r}"
    )


def _first_difference(
    served: str, trained: str, turns: list[tuple[str, str]]
) -> tuple[int, int] | None:
    """Where ``trained`` first departs from ``served`` (a position in each); None where they agree
    but for spans the serving template drops that each hold a turn's reasoning and end where both
    render the turn's answer (DeepSeek-R1's and Qwen3's history: why a training template exists).
    ``turns``: each assistant turn's (reasoning, answer)."""
    i = j = 0
    while True:
        same = len(os.path.commonprefix([served[i:], trained[j:]]))
        i, j = i + same, j + same
        if i == len(served) and j == len(trained):
            return None
        resumed = _dropped(served, trained, i, j, turns)
        if resumed is None:
            return i, j
        i, j = resumed


def _dropped(served, trained, i, j, turns) -> tuple[int, int] | None:
    """Where ``served`` and ``trained`` resume after a span that ``served`` drops at (i, j): one
    that holds the nearest turn's reasoning, no answer, and ends where both render that turn's
    answer; None if there is none."""
    found = [(trained.find(r, j), r, a) for r, a in turns if r and trained.find(r, j) >= 0]
    if not found:
        return None
    at, reasoning, answer = min(found)
    if any(a and a in trained[j:at] for _, a in turns):
        return None
    t, s = trained.find(answer, at + len(reasoning)), served.find(answer, i)
    lead = served[i:s]  # what the serving template writes from the difference to the answer
    if t < 0 or s < 0 or t - len(lead) < at + len(reasoning) or trained[t - len(lead) : t] != lead:
        return None
    return s, t


def _structure(tokenizer, template: TrainingTemplate, split: re.Pattern) -> list[str]:
    """The template's role headers and trailers, longest first: the text it writes identically
    right before (after) every turn of a role, found by rendering probes with two turns of each
    role (OpenChat's "GPT4 Correct User: ", OLMo-2's "<|assistant|>\\n"). What it writes once (a
    default system prompt, Llama 3.1's knowledge date) is not among them."""
    found = set()
    for roles in (("user", "assistant") * 2, ("system", "user", "assistant") * 2):
        probe = [{"role": r, "content": f"{SENTINEL} {k}"} for k, r in enumerate(roles)]
        try:
            text = tokenizer.apply_chat_template(probe, chat_template=template.text, tokenize=False)
        # a template that refuses a probe (a second system turn) shows no structure with it
        except Exception:  # noqa: BLE001
            continue
        at = [text.find(m["content"]) for m in probe]
        if -1 in at or at != sorted(at):
            continue
        ends = [a + len(m["content"]) for a, m in zip(at, probe, strict=True)]
        # turn k has gaps[k] before it and gaps[k + 1] after it
        gaps = [
            text[: at[0]],
            *(text[e:a] for e, a in zip(ends, at[1:], strict=False)),
            text[ends[-1] :],
        ]
        for role in set(roles):
            ks = [k for k, r in enumerate(roles) if r == role]
            before, after = gaps[ks[0]], gaps[ks[0] + 1]
            header = os.path.commonprefix([gaps[k][::-1] for k in ks])
            found.add(_whole(before, len(before) - len(header), len(before), split))
            found.add(_whole(after, 0, len(os.path.commonprefix([gaps[k + 1] for k in ks])), split))
    return sorted((f for f in found if f.strip()), key=len, reverse=True)


def _whole(text: str, start: int, end: int, split: re.Pattern) -> str:
    """``text[start:end]`` narrowed to cut no special token in two."""
    for token in split.finditer(text):
        if token.start() < start < token.end():
            start = token.end()
        if token.start() < end < token.end():
            end = token.start()
    return text[start:end]
