"""Every chat template TRL ships, on a small local tokenizer with the template's special tokens:
it either supervises exactly each assistant turn's reasoning and answer (fed the template's way)
and its end-of-turn marker, or it is refused before training, naming the template and what went
missing or leaked."""

import re
from pathlib import Path

import pytest
import trl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from stillroom.grading.formats import with_effort_tag
from stillroom.io import DataError
from stillroom.runtime.sft import encode_checked, place_tags
from stillroom.runtime.templates import training_template

TRL_TEMPLATES = Path(trl.__file__).parent / "chat_templates"
FILES = sorted(p.name for p in TRL_TEMPLATES.glob("*.jinja"))
# the marker-like literals of a template: <|im_start|>, <｜User｜>, <start_of_turn>, <|turn>, [INST]
MARKERS = re.compile(
    r"<\|[^|<>\s'\"]+\|>|<｜[^<>'\"]+｜>|</?[A-Za-z_]\w*>|<\|\w+>|<\w+\|>|\[/?[A-Z_]+\]"
)
REASONING = "Add 2 and 5.\nThat is 7."
ANSWER = "The answer is \\boxed{7}."
TAG = "{reasoning effort: high}"
# what a refusal may name as the cause
CAUSES = (
    "is never rendered",
    "rendered but not supervised",
    "the template adds text of its own",
    "text the row never wrote is supervised",
    "more than an end-of-turn marker",
    "tokens precede its first supervised token",
    "refuses a system turn",
    "do not render with",
    "has no {% generation %} markers",
    "supervision starts before the serving template's generation prompt ends",
    "which the model writes after the serving template's generation prompt",
    "does not follow the serving template's generation prompt",
    "renders it unlike the serving template",
    "supervision ends in the text token",
    "spans of supervision for its",
)


def tokenizer_for(tmp_path, text: str):
    """A byte-level BPE with the template's markers as special tokens, saved and loaded back."""
    specials = sorted(set(MARKERS.findall(text)) | {"<pad>", "<bos>", "<eos>"})
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([REASONING, ANSWER, "What is 2 + 5?"] * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    fast.chat_template = text
    fast.save_pretrained(tmp_path / "tok")
    return AutoTokenizer.from_pretrained(tmp_path / "tok")


def rows():
    """Rows as the dataset stage writes them: tagged (a system turn) and untagged, one and two
    assistant turns."""
    think = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
    turn = [{"role": "user", "content": "What is 2 + 5?"}, {"role": "assistant", "content": think}]
    second = [{"role": "user", "content": "And 4 + 5?"}, {"role": "assistant", "content": ANSWER}]
    return [
        {"id": "tagged", "tagged": True, "messages": with_effort_tag(turn, TAG)},
        {"id": "untagged", "tagged": False, "messages": turn},
        {"id": "two-turns", "tagged": True, "messages": with_effort_tag(turn + second, TAG)},
    ]


def supervised(tok, enc) -> str:
    """The supervised tokens, decoded, with the tokenizer's special tokens taken out."""
    ids = [t for t, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
    return tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("where", ["system", "user"])
@pytest.mark.parametrize("name", FILES)
def test_every_trl_template_trains_right_or_is_refused_by_name(tmp_path, name, where):
    text = (TRL_TEMPLATES / name).read_text(encoding="utf-8")
    tok = tokenizer_for(tmp_path, text)
    examples = place_tags(rows(), where)
    try:
        template = training_template(tok, where="the student")
        encoded, checked = encode_checked(tok, template, examples, max_length=256)
    except DataError as exc:
        message = str(exc)
        stem = name.removesuffix(".jinja").removesuffix("_training")
        assert re.search(rf"TRL's {stem}(_training)?\.jinja, sha256 [0-9a-f]{{12}}", message)
        assert any(cause in message for cause in CAUSES), message
        assert "train.chat_template" in message or "effort_tag_in" in message, message
        return
    assert checked["passed"] and checked["rows_checked"] == len(examples)
    assert (
        checked["sha256"] == template.sha256 and name.removesuffix(".jinja") in checked["template"]
    )
    for enc in encoded:
        got = supervised(tok, enc)
        # the reasoning before the answer, the second turn's answer last; of the prompt nothing
        assert REASONING in got and got.index(REASONING) < got.index(ANSWER), got
        assert got.rstrip().endswith(ANSWER), got
        assert "What is" not in got and "4 + 5" not in got and "effort" not in got, got
        # besides them only markers: what is left has no word but a think tag's
        rest = got.replace(REASONING, "").replace(ANSWER, "")
        assert set(re.findall(r"[A-Za-z]+", rest)) <= {"think"}, rest
        assert got.count(REASONING) == 1 and rest.count("<think>") <= 1, got


def check(tmp_path, name, where="system", max_length=256):
    tok = tokenizer_for(tmp_path, (TRL_TEMPLATES / name).read_text(encoding="utf-8"))
    template = training_template(tok, where="the student")
    return tok, template, encode_checked(tok, template, place_tags(rows(), where), max_length)


def test_qwen3_8_reasoning_is_fed_once_and_its_effort_line_refused(tmp_path):
    """Inline, the reasoning rendered as a doubled <think>; fed as reasoning_content it renders
    once, and the template's own effort line, which contradicts the row's tag, is refused. The
    "<think>\\n" its generation prompt gives the model is not supervised."""
    tok = tokenizer_for(tmp_path, (TRL_TEMPLATES / "qwen3_8.jinja").read_text(encoding="utf-8"))
    template = training_template(tok, where="the student")
    assert template.reasoning_field == "reasoning_content"
    assert template.prompt_header == "<|im_start|>assistant\n<think>\n"
    enc = template.encode(tok, rows()[0]["messages"])
    ids = [t for t, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
    assert tok.decode(ids) == f"{REASONING}\n</think>\n\n{ANSWER}<|im_end|>"
    with pytest.raises(DataError, match=r"qwen3_8_training.jinja.*row tagged: .*Reasoning effort"):
        encode_checked(tok, template, rows(), 256)


def test_qwen3_trains_with_reasoning_content(tmp_path):
    tok, template, (encoded, checked) = check(tmp_path, "qwen3.jinja")
    assert checked["reasoning_field"] == "reasoning_content" and checked["passed"]
    runs = tok.decode([t for t, m in zip(*encoded[0].values(), strict=True) if m])
    assert runs == f"<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>"


def test_gpt_oss_reasoning_goes_to_the_analysis_channel(tmp_path):
    tok = tokenizer_for(tmp_path, (TRL_TEMPLATES / "gptoss.jinja").read_text(encoding="utf-8"))
    template = training_template(tok, where="the student")
    assert template.reasoning_field in ("reasoning_content", "thinking")
    text = tok.decode(template.encode(tok, rows()[1]["messages"])["input_ids"])
    assert f"<|channel|>analysis<|message|>{REASONING}" in text
    assert f"<|channel|>final<|message|>{ANSWER}" in text
    # and its default system prompt is text the row never wrote
    with pytest.raises(DataError, match="the template adds text of its own: 'You are ChatGPT"):
        encode_checked(tok, template, rows(), 512)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("deepseekv3.jinja", r"deepseekv3_training.jinja.*message 1's reasoning is never rendered"),
        ("idefics3.jinja", r"idefics3_training.jinja.*message 1's answer is never rendered"),
        ("smolvlm.jinja", r"smolvlm_training.jinja.*message 1's answer is never rendered"),
        # a default system prompt is written once, not around every turn: not a role header
        (
            "qwen2_5.jinja",
            r"qwen2_5_training.jinja.*row untagged: the template adds text of its own: 'You are "
            "Qwen, created by Alibaba Cloud",
        ),
        # the serving prompt opens an empty think block; the rows' reasoning would be trained
        (
            "qwen3_5_nothink.jinja",
            r"qwen3_5_nothink_training.jinja.*row tagged: message 2's supervision starts before "
            r"the serving template's generation prompt ends \('<think>\\n\\n</think>\\n\\n' is the "
            r"prompt's",
        ),
        (
            "phi3.jinja",
            r"phi3_training.jinja.*more than an end-of-turn marker .*'<\|end\|>\\n<eos>'",
        ),
        (
            "cohere2.jinja",
            r"cohere2_training.jinja.*row tagged: \d+ tokens precede its first "
            r"supervised token \(\d+ of them the row.s own text\), more than train.max_length 256",
        ),
    ],
)
def test_what_the_issue_found_is_refused_with_its_cause(tmp_path, name, match):
    with pytest.raises(DataError, match=match) as refused:
        check(tmp_path, name)
    # Cohere's two closing markers are what it writes between turns: not a cause
    assert name != "cohere2.jinja" or "more than an end-of-turn" not in str(refused.value)


def test_gemma_takes_the_effort_tag_in_the_user_turn(tmp_path):
    with pytest.raises(
        DataError,
        match=r"TRL's gemma_training.jinja.*refuses a system turn \(TemplateError: System role "
        r"not supported\).*student.effort_tag_in: user",
    ):
        check(tmp_path, "gemma.jinja")
    tok, _, (encoded, checked) = check(tmp_path, "gemma.jinja", where="user")
    assert checked["passed"]
    text = tok.decode(encoded[0]["input_ids"])
    assert f"<start_of_turn>user\n{TAG}\nWhat is 2 + 5?<end_of_turn>" in text
