"""Chat templates TRL ships no training variant of (tests/runtime/template_families.py: our own
templates to the published formats of OLMo-2, Tulu-3, InternLM2, Hermes-3, SmolLM2, Yi, Mistral
v7, Mixtral, Llama-2, Phi-4, R1-Distill, QwQ, OpenChat, Falcon2, EXAONE, Granite, Nemotron-mini),
on small local tokenizers with each format's special tokens. As shipped each is refused (no
markers); a correct marked copy supervises exactly what the served model writes (counted here
from the serving template's prompts, not from the masks) or is refused for a true reason; the
broken markings issue 40 found are refused with their cause."""

import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from stillroom.grading.formats import with_effort_tag
from stillroom.io import DataError
from stillroom.runtime.sft import encode_checked, place_tags
from stillroom.runtime.stops import control_token, stop_set
from stillroom.runtime.templates import training_template

from .template_families import ANSWER, CONTENT, FAMILIES, REASONING, Family
from .test_templates import TRL_TEMPLATES
from .test_templates import family_tokenizer as trl_family_tokenizer

TAG = "{reasoning effort: high}"
# a second turn with other numbers: its reasoning and answer differ from the first's
SECOND = CONTENT.replace("5", "4").replace("7", "9")
# the correct marked copy is refused, and why: a default system prompt the rows never wrote, or
# no end-of-turn token to stop at
REFUSED = {
    "smollm2": r"row untagged: the template adds text of its own: 'You are a helpful AI assistant "
    "named SmolLM",
    "granite": r"row untagged: the template adds text of its own: 'Knowledge Cutoff Date",
    "falcon2": r"ends in the text token '.'.*writes no end-of-turn token after an assistant turn"
    r".*could never learn to stop",
    "nemotron_mini": r"ends in the text token '.'.*writes no end-of-turn token after an assistant "
    r"turn.*could never learn to stop",
}
TRAINED = [name for name in FAMILIES if name not in REFUSED]


def family_tokenizer(tmp_path, family: Family, template: str):
    """A small byte-level BPE with the format's special tokens (and its text-like added tokens,
    such as Qwen's <think>), the template as its chat template, saved and loaded back."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(family.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [REASONING, ANSWER, "What is 2 + 5?", TAG, "GPT4 Correct User Assistant Falcon"]
    tok.train_from_iterator(corpus * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=family.specials[0],
    )
    fast.add_tokens(list(family.texts))
    fast.chat_template = template
    fast.save_pretrained(tmp_path / "tok")
    return AutoTokenizer.from_pretrained(tmp_path / "tok")


def marked(tmp_path, name: str, old: str = "", new: str = ""):
    """The family's tokenizer (serving template) and its marked copy as train.chat_template,
    with ``old`` replaced by ``new`` in the copy."""
    family = FAMILIES[name]
    assert old in family.training
    path = tmp_path / f"{name}_training.jinja"
    path.write_text(family.training.replace(old, new), encoding="utf-8")
    tok = family_tokenizer(tmp_path, family, family.serving)
    return tok, training_template(tok, path, where=name)


def rows(name: str, untagged: bool = True) -> list[dict]:
    turn = [
        {"role": "user", "content": "What is 2 + 5?"},
        {"role": "assistant", "content": CONTENT},
    ]
    second = [{"role": "user", "content": "And 4 + 5?"}, {"role": "assistant", "content": SECOND}]
    out = [
        {"id": "tagged", "tagged": True, "messages": with_effort_tag(turn, TAG)},
        {"id": "two-turns", "tagged": True, "messages": with_effort_tag(turn + second, TAG)},
    ]
    if untagged:
        out.append({"id": "untagged", "tagged": False, "messages": turn})
    return place_tags(out, FAMILIES[name].where)


def supervised_runs(tok, enc) -> list[str]:
    runs, current = [], []
    for token, bit in zip(enc["input_ids"], enc["assistant_masks"], strict=True):
        if bit:
            current.append(token)
        elif current:
            runs.append(tok.decode(current))
            current = []
    return runs + ([tok.decode(current)] if current else [])


def served_tokens(tok, family: Family, messages: list[dict]) -> tuple[list[str], int]:
    """What the served model writes for each assistant turn (the format's ``writes``), and how
    many tokens that is after each of the serving template's generation prompts: the count a
    correct marking must supervise, taken without the masks."""
    texts, count = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        text = family.writes
        if m["content"] == SECOND:
            text = text.replace("5", "4").replace("7", "9")
        prompt = tok.apply_chat_template(
            messages[:i], chat_template=family.serving, tokenize=False, add_generation_prompt=True
        )
        ids = tok(prompt + text, add_special_tokens=False)["input_ids"]
        count += len(ids) - len(tok(prompt, add_special_tokens=False)["input_ids"])
        texts.append(text)
    return texts, count


@pytest.mark.parametrize("name", FAMILIES)
def test_as_shipped_each_is_refused_for_want_of_markers(tmp_path, name):
    family = FAMILIES[name]
    tok = family_tokenizer(tmp_path, family, family.serving)
    with pytest.raises(DataError, match=r"no \{% generation %\} markers.*train\.chat_template"):
        training_template(tok, where=name)


@pytest.mark.parametrize("name", TRAINED)
def test_a_correct_marked_copy_supervises_what_the_served_model_writes(tmp_path, name):
    """OpenChat's three-word role headers are structure, not text the template adds; Mistral v7's,
    Llama-2's and OpenChat's reply opens with a space the model writes, which is supervised;
    R1-Distill's and QwQ's reasoning, which their serving templates drop, is."""
    family = FAMILIES[name]
    tok, template = marked(tmp_path, name)
    examples = rows(name)
    encoded, checked = encode_checked(tok, template, examples, max_length=512)
    assert checked["passed"] and checked["rows_checked"] == len(examples)
    for ex, enc in zip(examples, encoded, strict=True):
        texts, count = served_tokens(tok, family, ex["messages"])
        assert supervised_runs(tok, enc) == texts
        assert sum(enc["assistant_masks"]) == count
    eot = tok(family.writes, add_special_tokens=False)["input_ids"][-1]
    assert template.end_of_turn(tok) == eot and control_token(tok, eot)
    assert checked["end_of_turn"] == tok.convert_ids_to_tokens(eot)


@pytest.mark.parametrize("name", REFUSED)
def test_a_correct_marked_copy_is_refused_for_a_true_reason(tmp_path, name):
    tok, template = marked(tmp_path, name)
    with pytest.raises(DataError, match=rf"train.chat_template .*{name}_training.jinja.*"):
        encode_checked(tok, template, rows(name), max_length=512)
    with pytest.raises(DataError, match=REFUSED[name]):
        encode_checked(tok, template, rows(name), max_length=512)


@pytest.mark.parametrize("name", ["smollm2", "granite"])
def test_with_a_system_turn_no_default_system_prompt_is_written_and_it_trains(tmp_path, name):
    tok, template = marked(tmp_path, name)
    examples = rows(name, untagged=False)
    encoded, checked = encode_checked(tok, template, examples, max_length=512)
    assert checked["passed"]
    for ex, enc in zip(examples, encoded, strict=True):
        texts, count = served_tokens(tok, FAMILIES[name], ex["messages"])
        assert supervised_runs(tok, enc) == texts and sum(enc["assistant_masks"]) == count


# (family, what the copy marks differently, the cause named)
BROKEN = [
    # the end-of-turn token left outside the markers: the supervised turn ends in text
    *[
        (
            name,
            (f"{eot}{{% endgeneration %}}", f"{{% endgeneration %}}{eot}"),
            rf"ends in the text token .*the end-of-turn token '{re.escape(token)}' the template "
            r"writes after it is not supervised",
        )
        for name, eot, token in [
            ("hermes3", "<|im_end|>", "<|im_end|>"),
            ("phi4", "<|im_end|>", "<|im_end|>"),
            ("exaone", "[|endofturn|]", "[|endofturn|]"),
            ("openchat", "<|end_of_turn|>", "<|end_of_turn|>"),
            ("mistral_v7", "{{ eos_token }}", "</s>"),
            ("r1_distill", "{{ eos_token }}", "<｜end▁of▁sentence｜>"),
        ]
    ],
    # supervision starting after the space the model writes after the generation prompt
    *[
        (
            name,
            ("{% generation %} ", " {% generation %}"),
            r"message \d's ' ', which the model writes after the serving template's generation "
            r"prompt \(.*\), is not supervised",
        )
        for name in ("openchat", "mistral_v7", "llama2")
    ],
    # a copy that drops the newline the serving template writes after a turn
    (
        "hermes3",
        ("{% endgeneration %}{{ '\\n' }}", "{% endgeneration %}"),
        r"renders it unlike the serving template: after '.*<\|im_end\|>' the serving template "
        r"writes '\\n<\|im_start\|>user",
    ),
    (
        "exaone",
        ("{% endgeneration %}{{ '\\n' }}", "{% endgeneration %}"),
        r"renders it unlike the serving template: after '.*\[\|endofturn\|\]' the serving "
        r"template writes '\\n\[\|user\|\]",
    ),
    (
        "olmo2",
        ("{% if not loop.last %}{{ '\\n' }}{% endif %}{% else %}", "{% else %}"),
        r"renders it unlike the serving template: after '.*<\|endoftext\|>' the serving template "
        r"writes '\\n<\|user\|>",
    ),
]


@pytest.mark.parametrize(("name", "change", "cause"), BROKEN)
def test_a_broken_marking_is_refused_with_its_cause(tmp_path, name, change, cause):
    tok, template = marked(tmp_path, name, *change)
    with pytest.raises(DataError, match=rf"{name}_training\.jinja.*{cause}"):
        encode_checked(tok, template, rows(name), max_length=512)


ASSISTANT = (
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
    "message['content'] | trim + '<|eot_id|>' }}"
)


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        # marked right, it is refused for the knowledge date it writes into every conversation
        (
            "{%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}",
            r"the template adds text of its own: 'Cutting Knowledge Date",
        ),
        # as some toolkits mark it: <|eot_id|> is never trained
        (
            "{%- generation %}{{- message['content'] | trim }}{%- endgeneration %}"
            "{{- '<|eot_id|>' }}",
            r"ends in the text token .*the end-of-turn token '<\|eot_id\|>' the template writes "
            r"after it is not supervised",
        ),
    ],
)
def test_llama3_1_marked_from_trls_template(tmp_path, body, cause):
    """TRL ships Llama 3.1's serving template (read from the installed package) and no training
    variant; a copy marked here."""
    text = (TRL_TEMPLATES / "llama3_1.jinja").read_text(encoding="utf-8")
    assert text.count(ASSISTANT) == 1
    copy = text.replace(
        ASSISTANT,
        "{%- if message['role'] == 'assistant' %}"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}" + body + "{%- else %}"
        f"{ASSISTANT}{{%- endif %}}",
    )
    path = tmp_path / "llama3_1_training.jinja"
    path.write_text(copy, encoding="utf-8")
    tok, _ = trl_family_tokenizer(tmp_path, "llama3", text)
    template = training_template(tok, path)
    with pytest.raises(DataError, match=cause):
        encode_checked(tok, template, rows("hermes3", untagged=False), max_length=512)


def test_a_text_added_token_is_never_a_stop_token(tmp_path):
    """Qwen's <think> and </think> are added tokens that are text (not special): a template that
    writes one right after a reply does not make it a stop token."""
    family = FAMILIES["qwq"]
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% if m['role'] == 'assistant' %}</think>{% endif %}<|im_end|>\n{% endfor %}"
    )
    tok = family_tokenizer(tmp_path, family, template)
    think = tok.convert_tokens_to_ids("</think>")
    assert think in tok.added_tokens_decoder and not control_token(tok, think)
    assert control_token(tok, tok.convert_tokens_to_ids("<|im_end|>"))
    stops = stop_set(str(tmp_path / "tok"), tok)
    assert stops.sources["chat_template"] is None and think not in stops.ids
