"""Training templates for real chat templates (the ones TRL ships, which real models carry): the
supervised tokens are exactly each assistant turn's reasoning, answer and end-of-turn token, the
reasoning is trained even where the serving template drops it, and a template nothing can mark
fails with its cause."""

from pathlib import Path

import pytest
import trl
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from stillroom.io import DataError
from stillroom.runtime.templates import config_problem, training_template

TRL_TEMPLATES = Path(trl.__file__).parent / "chat_templates"
REASONING = "Add 2 and 5.\nThat is 7."
ANSWER = "The answer is \\boxed{7}."
CONTENT = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"

# family: (TRL's serving template, special tokens, bos, eos, what the model writes for CONTENT)
FAMILIES = {
    "qwen3": (
        "qwen3.jinja",
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        None,
        "<|im_end|>",
        CONTENT + "<|im_end|>",
    ),
    "llama3": (
        "llama3.jinja",
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
        CONTENT + "<|eot_id|>",
    ),
    # the generation prompt already holds "<think>\n": the model writes from the reasoning on
    "deepseek_r1_distill": (
        "deepseek_r1_distill.jinja",
        ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
        + ["<think>", "</think>"],
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        f"{REASONING}\n</think>\n\n{ANSWER}<｜end▁of▁sentence｜>",
    ),
}


def family_tokenizer(tmp_path, family, template_text=None):
    """A small byte-level BPE with the family's special tokens and chat template, saved and
    loaded back as a model directory would be."""
    serving, specials, bos, eos, _ = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [REASONING, ANSWER, "What is 2 + 5?", "Think step by step.", "system user assistant"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=specials[0]
    )
    fast.chat_template = template_text or (TRL_TEMPLATES / serving).read_text(encoding="utf-8")
    out = tmp_path / family
    fast.save_pretrained(out)
    return AutoTokenizer.from_pretrained(out), out


def supervised_runs(tok, encoded):
    """The decoded text of each run of supervised tokens."""
    runs, current = [], []
    for token, bit in zip(encoded["input_ids"], encoded["assistant_masks"], strict=True):
        if bit:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tok.decode(run) for run in runs]


def conversation(system=True):
    return [
        *([{"role": "system", "content": "Effort: high."}] if system else []),
        {"role": "user", "content": "What is 2 + 5?"},
        {"role": "assistant", "content": CONTENT},
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_supervised_tokens_are_what_the_model_writes(tmp_path, family):
    tok, _ = family_tokenizer(tmp_path, family)
    template = training_template(tok)
    assert template.origin == "trl"
    encoded = template.encode(tok, conversation())
    assert supervised_runs(tok, encoded) == [FAMILIES[family][4]]
    # the tokens are those of the whole conversation rendered with the training template
    text = tok.apply_chat_template(conversation(), chat_template=template.text, tokenize=False)
    assert tok.decode(encoded["input_ids"]) == text
    # what the model writes at inference: the serving prompt followed by the supervised tokens
    prompt = tok.apply_chat_template(
        conversation()[:-1], tokenize=False, add_generation_prompt=True
    )
    assert (prompt + FAMILIES[family][4]).startswith(text.rstrip())
    # the token a reply ends with is the one the model must stop at when served
    assert template.end_of_turn(tok) == tok.convert_tokens_to_ids(FAMILIES[family][3])


def test_deepseek_reasoning_is_trained_though_its_serving_template_drops_it(tmp_path):
    tok, _ = family_tokenizer(tmp_path, "deepseek_r1_distill")
    assert REASONING not in tok.apply_chat_template(conversation(), tokenize=False)
    encoded = training_template(tok).encode(tok, conversation())
    assert REASONING in supervised_runs(tok, encoded)[0]


def test_every_turn_of_a_multi_turn_conversation_keeps_its_reasoning(tmp_path):
    """Qwen3's serving template keeps only the last turn's reasoning; training keeps each."""
    tok, _ = family_tokenizer(tmp_path, "qwen3")
    second = CONTENT.replace("7", "9")
    messages = [
        *conversation(system=False),
        {"role": "user", "content": "And 4 + 5?"},
        {"role": "assistant", "content": second},
    ]
    assert tok.apply_chat_template(messages, tokenize=False).count(REASONING) == 0
    runs = supervised_runs(tok, training_template(tok).encode(tok, messages))
    assert runs == [CONTENT + "<|im_end|>", second + "<|im_end|>"]


def test_a_template_with_markers_is_used_as_it_is(tmp_path):
    from stillroom.runtime.student import CHAT_TEMPLATE

    tok, _ = family_tokenizer(tmp_path, "qwen3", template_text=CHAT_TEMPLATE)
    template = training_template(tok)
    assert template.origin == "model" and template.text == CHAT_TEMPLATE
    runs = supervised_runs(tok, template.encode(tok, conversation()))
    assert runs == [CONTENT + "<|im_end|>"]


UNKNOWN = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_an_unknown_template_without_markers_names_the_cause_and_the_fix(tmp_path):
    tok, model_dir = family_tokenizer(tmp_path, "qwen3", template_text=UNKNOWN)
    with pytest.raises(DataError, match=r"no \{% generation %\} markers.*train\.chat_template"):
        training_template(tok)
    problem = config_problem(str(model_dir), None, tmp_path)
    assert "student.pretrained" in problem and "train.chat_template" in problem


def test_a_configured_template_serves_an_unknown_model(tmp_path):
    tok, model_dir = family_tokenizer(tmp_path, "qwen3", template_text=UNKNOWN)
    marked = UNKNOWN.replace(
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n",
        "<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>"
        "{% endif %}\n",
    )
    path = tmp_path / "train.jinja"
    path.write_text(marked)
    template = training_template(tok, path)
    assert template.origin == str(path)
    assert supervised_runs(tok, template.encode(tok, conversation())) == [CONTENT + "<|im_end|>"]
    assert config_problem(str(model_dir), "train.jinja", tmp_path) is None

    path.write_text(UNKNOWN)
    with pytest.raises(DataError, match="train.chat_template: .*no {% generation %} markers"):
        training_template(tok, path)
    assert "no {% generation %} markers" in config_problem(None, "train.jinja", tmp_path)


def test_a_hub_student_is_not_looked_up_at_dag_build(tmp_path):
    assert config_problem("Qwen/Qwen3-4B-Base", None, tmp_path) is None
