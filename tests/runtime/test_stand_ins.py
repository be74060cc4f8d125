"""The stand-ins of a recipe's hub models: a student shipped as Qwen3 base models are (Qwen3's
template and special tokens, end of text as its end) and a teacher that answers its prompts."""

import json

import pytest
from transformers import AutoTokenizer

from stillroom.data.records import record
from stillroom.runtime.stand_ins import answer_for, build, qwen3_template
from stillroom.runtime.templates import training_template

RECORDS = [
    record("deepmath", "math", "Let x be 3 plus 4. What is x times 2?", "14", {}),
    record("deepmath", "math", "Let x be 9 minus 2. What is x plus 5?", "12", {}),
    record("openscience", "choice", "Which is a noble gas?\nA) neon\nB) iron", "A", {}),
]


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    root = tmp_path_factory.mktemp("stand-ins")
    metrics = build(
        RECORDS,
        student_dir=root / "student",
        teacher_dir=root / "teacher",
        vocab_size=400,
        steps=150,
        log=lambda _: None,
    )
    return root, metrics


@pytest.mark.slow
def test_the_student_is_shipped_as_a_qwen3_base_model_is(stand_ins):
    root, _ = stand_ins
    tok = AutoTokenizer.from_pretrained(root / "student")
    assert tok.chat_template == qwen3_template()
    assert "{% generation %}" not in tok.chat_template  # the real, unmarked template
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|endoftext|>",) * 2 + (None,)
    # the reasoning markers survive decoding, as Qwen3's do
    ids = tok("<think>\nx\n</think>", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>"
    config = json.loads((root / "student" / "generation_config.json").read_text())
    assert config["eos_token_id"] == [tok.convert_tokens_to_ids("<|endoftext|>")]
    # assistant-only loss goes through TRL's training variant of Qwen3's template
    assert training_template(tok).origin == "trl"


def test_the_teacher_answers_every_prompt_it_stands_in_for(stand_ins):
    import torch
    from transformers import AutoModelForCausalLM

    root, metrics = stand_ins
    assert metrics["teacher_exact"] == 1.0 and metrics["prompts"] == 3
    tok = AutoTokenizer.from_pretrained(root / "teacher")
    model = AutoModelForCausalLM.from_pretrained(root / "teacher")
    rec = RECORDS[2]
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": rec["prompt"]}], add_generation_prompt=True, tokenize=False
    )
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=80, do_sample=False)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert text == answer_for(rec)  # stopped at <|im_end|>, its generation config's end


@pytest.mark.parametrize(
    ("recipe", "expected"),
    [
        ("config/config.yaml", "teachers.procedural must be served from a command"),
        ("config/experiments/beam-distill.yaml", "sources.0.path (zwhe99/DeepMath-103K)"),
    ],
)
def test_a_config_without_a_served_teacher_or_local_sources_is_refused_by_name(
    recipe, expected, capsys
):
    from stillroom.cli import main

    from ..conftest import REPO

    assert main(["stand-ins", str(REPO / recipe), "--root", str(REPO)]) == 2
    assert expected in capsys.readouterr().err
