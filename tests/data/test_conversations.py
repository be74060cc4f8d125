import json

import pytest
from transformers import AutoTokenizer

from stillroom.data.conversations import check_renders, load_conversations
from stillroom.io import DataError
from stillroom.runtime.student import CHAT_TEMPLATE, train_tokenizer

# The student template before tool support: plain conversations must still render byte-identically.
OLD_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|im_start|>assistant\n{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}"
    "{{ '\\n' }}"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>{{ '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

PLAIN = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "<think>3 + 4 = 7.</think>\nThe answer is \\boxed{7}."},
    {"role": "user", "content": "  spaces\n\nand {{ braces }} %}"},
    {"role": "assistant", "content": ""},
]


def tool_row(id="t1"):
    return {
        "id": id,
        "messages": [
            {"role": "user", "content": "Sum 2 and 3; how is Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "type": "function",
                        "id": "call_1",
                        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                    },
                    {
                        "type": "function",
                        "id": "call_2",
                        "function": {"name": "weather", "arguments": {"city": "Oslo"}},
                    },
                ],
            },
            {
                "role": "tool",
                "name": "add",
                "tool_call_id": "call_1",
                "content": "5",
                "extra": "dropped",
            },
            {
                "role": "tool",
                "name": "weather",
                "tool_call_id": "call_2",
                "content": '{"sky": "grey"}',
            },
            {"role": "assistant", "content": "2 + 3 = 5 and Oslo is grey."},
        ],
    }


def write_rows(path, rows):
    """Rows as JSONL; None writes a blank line, a str is written verbatim."""
    lines = ["" if r is None else r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "tokenizer"
    texts = [m["content"] or "" for m in tool_row()["messages"] + PLAIN] + [
        '<tool_call>\n{"name": "add"}'
    ]
    train_tokenizer(texts * 5, out, vocab_size=300, min_frequency=2)
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return AutoTokenizer.from_pretrained(tok_dir)


def test_tool_conversation_loads_renders_and_masks_calls_as_assistant(tok, tmp_path):
    [ex] = load_conversations(write_rows(tmp_path / "d.jsonl", [tool_row()]))
    call = ex["messages"][1]
    assert call["content"] == "" and call["tool_calls"][0]["function"]["arguments"] == {
        "a": 2,
        "b": 3,
    }
    assert ex["messages"][2] == {
        "role": "tool",
        "content": "5",
        "name": "add",
        "tool_call_id": "call_1",
    }
    check_renders(tok, [ex], "d.jsonl")
    text = tok.apply_chat_template(ex["messages"], tokenize=False)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
        "</tool_call>\n"
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>tool\n<tool_response name="add">\n5\n</tool_response><|im_end|>\n'
    ) in text
    enc = tok.apply_chat_template(
        ex["messages"], return_dict=True, return_assistant_tokens_mask=True
    )
    pairs = list(zip(enc["input_ids"], enc["assistant_masks"], strict=False))
    assistant = tok.decode([t for t, bit in pairs if bit])
    assert assistant == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'
        "2 + 3 = 5 and Oslo is grey.<|im_end|>"
    )
    assert "tool_response" not in assistant and "<tool_response" in tok.decode(
        [t for t, bit in pairs if not bit]
    )


def test_plain_conversations_render_as_before(tok):
    assert tok.chat_template == CHAT_TEMPLATE
    for n in range(1, len(PLAIN) + 1):
        for gen in (False, True):
            ours = tok.apply_chat_template(PLAIN[:n], tokenize=False, add_generation_prompt=gen)
            old = tok.apply_chat_template(
                PLAIN[:n], tokenize=False, add_generation_prompt=gen, chat_template=OLD_TEMPLATE
            )
            assert ours == old
    kw = {"return_dict": True, "return_assistant_tokens_mask": True}
    assert tok.apply_chat_template(PLAIN, **kw) == tok.apply_chat_template(
        PLAIN, chat_template=OLD_TEMPLATE, **kw
    )


def edit(fn):
    row = tool_row()
    fn(row["messages"])
    return row


MSG = "key 'messages': message"


@pytest.mark.parametrize(
    "row, match",
    [
        (
            edit(lambda m: m[2].pop("name")),
            rf"{MSG} 2: tool message needs a non-empty string 'name'",
        ),
        (
            edit(lambda m: m[2].update(name="")),
            rf"{MSG} 2: tool message needs a non-empty string 'name'",
        ),
        (
            edit(lambda m: m[2].update(tool_call_id="call_9")),
            rf"{MSG} 2: tool_call_id 'call_9' answers no tool call",
        ),
        (
            edit(lambda m: m[2].update(name="weather")),
            rf"{MSG} 2: tool_call_id 'call_1' is a call to 'add', but .*'weather'",
        ),
        (
            edit(lambda m: m.insert(1, m.pop(2))),
            rf"{MSG} 1: tool_call_id 'call_1' answers no tool call of an earlier",
        ),
        (
            edit(lambda m: m[1]["tool_calls"][0]["function"].update(arguments='{"a": 2,')),
            rf"{MSG} 1: tool_calls\[0\] \(add\) arguments are not valid JSON",
        ),
        (
            edit(lambda m: m[1]["tool_calls"][1]["function"].update(arguments="[1]")),
            rf"{MSG} 1: tool_calls\[1\] \(weather\) arguments should be a JSON object",
        ),
        (
            edit(lambda m: m[1]["tool_calls"][0]["function"].pop("name")),
            rf"{MSG} 1: tool_calls\[0\] needs .*'name'",
        ),
        (
            edit(lambda m: m[1].pop("tool_calls")),
            rf"{MSG} 1: assistant message needs string content",
        ),
        (edit(lambda m: m[0].update(role="teacher")), rf"{MSG} 0: needs a role in"),
        (edit(lambda m: [m.pop(4), m.pop(1)]), r"key 'messages': no assistant turn"),
        ({"id": "x", "prompt": "hi"}, r"missing key 'messages'"),
        ("{not json", r"not valid JSON"),
    ],
)
def test_bad_rows_name_file_line_and_message(tmp_path, row, match):
    path = write_rows(
        tmp_path / "data.jsonl", [tool_row(), None, row]
    )  # the blank line still counts
    with pytest.raises(DataError, match=rf"data\.jsonl:3: {match}"):
        load_conversations(path)


def test_all_bad_rows_are_reported_together(tmp_path):
    no_name = edit(lambda m: m[2].pop("name"))
    bad_json = edit(lambda m: m[1]["tool_calls"][0]["function"].update(arguments="{"))
    rows = [tool_row(), no_name, None, bad_json, tool_row("ok"), None, None, "[]"]
    with pytest.raises(DataError) as info:
        load_conversations(write_rows(tmp_path / "data.jsonl", rows))
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / 'data.jsonl'}: 3 errors:")
    for line in (2, 4, 8):
        assert f"data.jsonl:{line}: " in msg
    assert "data.jsonl:1:" not in msg and "data.jsonl:5:" not in msg

    many = write_rows(tmp_path / "many.jsonl", [no_name] * 25)
    with pytest.raises(DataError, match=r"25 errors, first 20 shown") as info:
        load_conversations(many)
    assert "many.jsonl:20:" in str(info.value) and "many.jsonl:21:" not in str(info.value)


def test_blank_lines_keep_ids_and_line_numbers(tmp_path):
    row = tool_row()
    del row["id"]
    examples = load_conversations(
        write_rows(tmp_path / "d.jsonl", [None, row, None, None, tool_row("kept")])
    )
    assert [ex["id"] for ex in examples] == ["line 2", "kept"]
    with pytest.raises(DataError, match=r"d\.jsonl: no examples"):
        load_conversations(write_rows(tmp_path / "d.jsonl", [None, None]))


def test_template_without_tool_support_is_reported_by_id(tok, tok_dir, tmp_path):
    examples = load_conversations(
        write_rows(tmp_path / "d.jsonl", [tool_row("tools-1"), {"messages": PLAIN}])
    )
    strict = AutoTokenizer.from_pretrained(tok_dir)
    strict.chat_template = (
        "{% for m in messages %}"
        "{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    with pytest.raises(
        DataError, match=r"src: 1 of 2 examples .*: tools-1 \(TemplateError: no tool role\)$"
    ):
        check_renders(strict, examples, "src")
    # A template that silently drops tool calls and results renders, but the check still catches it.
    strict.chat_template = OLD_TEMPLATE
    with pytest.raises(
        DataError,
        match=r"tools-1 \(rendered text omits message 1 call to 'add', "
        r"message 1 call to 'weather', "
        r"message 2 tool result 'add', message 3 tool result 'weather'\)$",
    ):
        check_renders(strict, examples, "src")
    check_renders(tok, examples, "src")
