"""Chat templates of model families TRL ships no template for, written for these tests from each
family's published format (role headers, end-of-turn token, reasoning handling): a serving
template as the model ships it (no generation markers) and a copy marked for training
(``train.chat_template``). None is a copy of a model's template text.

Where each format is published (the hub repository's tokenizer_config.json / model card), and the
public text we read it from:
- LLAMA_CPP: ggml-org/llama.cpp, src/llama-chat.cpp at 0192c1297ddde77b0d9688179779e4218cf04db4
  (llm_chat_apply_template writes each named format by hand);
- OLMo-2: allenai/OLMo-2-1124-13B-Instruct tokenizer_config.json, as mirrored in
  mauer4/Attention-From-Scratch weights/allenai/OLMo-2-1124-13B-Instruct/tokenizer_config.json at
  7b2eb9540b3955e12c8645aa55cb131d38223f01 (``<|user|>``/``<|assistant|>`` are text there, not
  added tokens; eos ``<|endoftext|>``);
- Tulu-3: allenai/open-instruct's "tulu" chat template (CHAT_TEMPLATES), the format of
  allenai/Llama-3.1-Tulu-3-8B;
- Nemotron-mini: nvidia/Nemotron-Mini-4B-Instruct model card (``<extra_id_0>System``,
  ``<extra_id_1>User``, ``<extra_id_1>Assistant``, no end-of-turn token; the same turn layout is
  NVIDIA NeMo's SteerLM prompt format);
- Falcon2: tiiuae/falcon-11B model card ("User: ...\\nFalcon:", no end-of-turn token).
"""

from __future__ import annotations

from dataclasses import dataclass

# What an assistant turn of the test rows says (split_reasoning's form: reasoning, then answer).
REASONING = "Add 2 and 5.\nThat is 7."
ANSWER = "The answer is \\boxed{7}."
CONTENT = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"


@dataclass(frozen=True)
class Family:
    hub: str  # the model whose published format the templates follow
    source: str  # where the format is published / read
    specials: tuple[str, ...]  # the format's special (control) tokens; the first pads
    bos: str | None
    eos: str
    serving: str  # as the model ships it: no {% generation %} markers
    training: str  # the serving template marked for training
    # what the model writes after the serving generation prompt for an assistant turn with
    # CONTENT: the supervised text a correct marking gives
    writes: str
    where: str = "system"  # where the rows' effort tag goes (student.effort_tag_in)
    texts: tuple[str, ...] = ()  # added tokens that are text, not special (Qwen's <think>)


def chatml(bos: str = "", default_system: str = "", think: bool = False) -> tuple[str, str]:
    """A ChatML serving template (``<|im_start|>role\\n...<|im_end|>\\n``) and its marked copy;
    ``default_system`` written when the conversation has no system turn; ``think``: QwQ's
    handling (the prompt opens ``<think>\\n``, history keeps only the text after ``</think>``)."""
    head = bos
    if default_system:
        head += (
            "{% if messages[0]['role'] != 'system' %}<|im_start|>system\n"
            + default_system
            + "<|im_end|>\n{% endif %}"
        )
    prompt = "{% if add_generation_prompt %}<|im_start|>assistant\n" + (
        "<think>\n{% endif %}" if think else "{% endif %}"
    )
    turn = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
    other = "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    history = "m['content'].split('</think>')[-1].lstrip('\\n')" if think else "m['content']"
    serving = head + turn + "{{ " + history + " }}<|im_end|>\n" + other + prompt
    training = (
        head
        + turn
        + "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
        + other
        + prompt
    )
    return serving, training


def _family(serving_training: tuple[str, str], **kw) -> Family:
    serving, training = serving_training
    return Family(serving=serving, training=training, **kw)


CHATML = ("<|im_start|>", "<|im_end|>")
DS_SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")

FAMILIES: dict[str, Family] = {
    # <|user|>/<|assistant|> headers in plain text, the eos closes an assistant turn
    "olmo2": Family(
        hub="allenai/OLMo-2-1124-7B-Instruct",
        source="tokenizer_config.json (module docstring)",
        specials=("<|pad|>", "<|endoftext|>"),
        bos="<|endoftext|>",
        eos="<|endoftext|>",
        serving=(
            "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n"
            "{% if m['role'] == 'assistant' %}{{ m['content'] + eos_token }}"
            "{% if not loop.last %}{{ '\\n' }}{% endif %}{% else %}{{ m['content'] }}\n{% endif %}"
            "{% if loop.last and add_generation_prompt %}<|assistant|>\n{% endif %}{% endfor %}"
        ),
        training=(
            "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n"
            "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + eos_token }}"
            "{% endgeneration %}"
            "{% if not loop.last %}{{ '\\n' }}{% endif %}{% else %}{{ m['content'] }}\n{% endif %}"
            "{% if loop.last and add_generation_prompt %}<|assistant|>\n{% endif %}{% endfor %}"
        ),
        writes=CONTENT + "<|endoftext|>",
    ),
    "tulu3": Family(
        hub="allenai/Llama-3.1-Tulu-3-8B",
        source="open-instruct's tulu template (module docstring)",
        specials=("<pad>", "<|begin_of_text|>", "<|end_of_text|>"),
        bos="<|begin_of_text|>",
        eos="<|end_of_text|>",
        serving=(
            "{% for m in messages %}<|{{ m['role'] }}|>\n"
            "{% if m['role'] == 'assistant' %}{{ m['content'] + eos_token }}"
            "{% if not loop.last %}{{ '\\n' }}{% endif %}{% else %}{{ m['content'] }}\n{% endif %}"
            "{% if loop.last and add_generation_prompt %}<|assistant|>\n{% endif %}{% endfor %}"
        ),
        training=(
            "{% for m in messages %}<|{{ m['role'] }}|>\n"
            "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + eos_token }}"
            "{% endgeneration %}"
            "{% if not loop.last %}{{ '\\n' }}{% endif %}{% else %}{{ m['content'] }}\n{% endif %}"
            "{% if loop.last and add_generation_prompt %}<|assistant|>\n{% endif %}{% endfor %}"
        ),
        writes=CONTENT + "<|end_of_text|>",
    ),
    "internlm2": _family(
        chatml(bos="{{ bos_token }}"),
        hub="internlm/internlm2_5-7b-chat",
        source="tokenizer_config.json: ChatML after <s>; LLAMA_CPP's chatml",
        specials=("<unk>", "<s>", "</s>", *CHATML),
        bos="<s>",
        eos="</s>",
        writes=CONTENT + "<|im_end|>",
    ),
    "hermes3": _family(
        chatml(bos="{{ bos_token }}"),
        hub="NousResearch/Hermes-3-Llama-3.1-8B",
        source="model card (ChatML prompt format); LLAMA_CPP's chatml",
        specials=("<|finetune_right_pad_id|>", "<|begin_of_text|>", *CHATML),
        bos="<|begin_of_text|>",
        eos="<|im_end|>",
        writes=CONTENT + "<|im_end|>",
    ),
    # a default system prompt when the conversation has none
    "smollm2": _family(
        chatml(
            default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face"
        ),
        hub="HuggingFaceTB/SmolLM2-1.7B-Instruct",
        source="tokenizer_config.json: ChatML with a default system prompt",
        specials=("<|endoftext|>", *CHATML),
        bos=None,
        eos="<|im_end|>",
        writes=CONTENT + "<|im_end|>",
    ),
    # the system text bare before the turns; the user turn writes the assistant header
    "yi": Family(
        hub="01-ai/Yi-1.5-9B-Chat",
        source="tokenizer_config.json: ChatML, system text unwrapped, user turn ends in the header",
        specials=("<unk>", "<|startoftext|>", "<|endoftext|>", *CHATML),
        bos="<|startoftext|>",
        eos="<|im_end|>",
        serving=(
            "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}"
            "{% for m in messages %}{% if m['role'] == 'user' %}"
            "<|im_start|>user\n{{ m['content'] }}<|im_end|>\n<|im_start|>assistant\n"
            "{% elif m['role'] == 'assistant' %}{{ m['content'] }}<|im_end|>\n{% endif %}"
            "{% endfor %}"
        ),
        training=(
            "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}"
            "{% for m in messages %}{% if m['role'] == 'user' %}"
            "<|im_start|>user\n{{ m['content'] }}<|im_end|>\n<|im_start|>assistant\n"
            "{% elif m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>"
            "{% endgeneration %}{{ '\\n' }}{% endif %}{% endfor %}"
        ),
        writes=CONTENT + "<|im_end|>",
    ),
    # v7: a space opens each part, the reply included: the model writes " reply</s>"
    "mistral_v7": Family(
        hub="mistralai/Mistral-Large-Instruct-2411",
        source="model card (basic instruct template v7); LLAMA_CPP's mistral-v7",
        specials=(
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
        ),
        bos="<s>",
        eos="</s>",
        serving=(
            "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
            "[SYSTEM_PROMPT] {{ m['content'] }}[/SYSTEM_PROMPT]"
            "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }}[/INST]"
            "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
        ),
        training=(
            "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
            "[SYSTEM_PROMPT] {{ m['content'] }}[/SYSTEM_PROMPT]"
            "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }}[/INST]"
            "{% else %}{% generation %} {{ m['content'] }}{{ eos_token }}{% endgeneration %}"
            "{% endif %}{% endfor %}"
        ),
        writes=" " + CONTENT + "</s>",
    ),
    # v1 tokenizer: [INST] is text; no system turn
    "mixtral": Family(
        hub="mistralai/Mixtral-8x7B-Instruct-v0.1",
        source="tokenizer_config.json ([INST] ... [/INST], system refused); LLAMA_CPP's llama2",
        specials=("<unk>", "<s>", "</s>"),
        bos="<s>",
        eos="</s>",
        serving=(
            "{{ bos_token }}{% for m in messages %}"
            "{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
            "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
            "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
        ),
        training=(
            "{{ bos_token }}{% for m in messages %}"
            "{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
            "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
            "{% else %}{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}"
            "{% endif %}{% endfor %}"
        ),
        writes=CONTENT + "</s>",
        where="user",
    ),
    # <<SYS>> inside the first [INST]; the reply is " reply </s>", a bos opens each exchange
    "llama2": Family(
        hub="meta-llama/Llama-2-7b-chat-hf",
        source="tokenizer_config.json / the Llama 2 blog's prompt format; LLAMA_CPP's llama2-sys",
        specials=("<unk>", "<s>", "</s>"),
        bos="<s>",
        eos="</s>",
        serving=(
            "{% set sys = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
            "{% for m in messages if m['role'] != 'system' %}{% if m['role'] == 'user' %}"
            "{{ bos_token }}[INST] {% if loop.first and sys %}<<SYS>>\n{{ sys }}\n<</SYS>>\n\n"
            "{% endif %}{{ m['content'] | trim }} [/INST]"
            "{% else %} {{ m['content'] | trim }} {{ eos_token }}{% endif %}{% endfor %}"
        ),
        training=(
            "{% set sys = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
            "{% for m in messages if m['role'] != 'system' %}{% if m['role'] == 'user' %}"
            "{{ bos_token }}[INST] {% if loop.first and sys %}<<SYS>>\n{{ sys }}\n<</SYS>>\n\n"
            "{% endif %}{{ m['content'] | trim }} [/INST]"
            "{% else %}{% generation %} {{ m['content'] | trim }} {{ eos_token }}"
            "{% endgeneration %}{% endif %}{% endfor %}"
        ),
        writes=" " + CONTENT + " </s>",
    ),
    "phi4": Family(
        hub="microsoft/phi-4",
        source="tokenizer_config.json (<|im_start|>role<|im_sep|>); LLAMA_CPP's phi4",
        specials=("<|dummy_85|>", "<|endoftext|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>"),
        bos=None,
        eos="<|im_end|>",
        serving=(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}<|im_sep|>{{ m['content'] }}"
            "<|im_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif %}"
        ),
        training=(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}<|im_sep|>"
            "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>"
            "{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif %}"
        ),
        writes=CONTENT + "<|im_end|>",
    ),
    # the serving template keeps only the text after </think>; the prompt opens <think>\n
    "r1_distill": Family(
        hub="deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
        source="tokenizer_config.json; LLAMA_CPP's deepseek3 (<｜User｜>, <｜Assistant｜>)",
        specials=DS_SPECIALS,
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
        serving=(
            "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
            "{{ m['content'] }}{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
            "{% else %}<｜Assistant｜>{{ m['content'].split('</think>')[-1] }}{{ eos_token }}"
            "{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
        ),
        training=(
            "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
            "{{ m['content'] }}{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
            "{% else %}<｜Assistant｜>{% generation %}{{ m['content'] }}{{ eos_token }}"
            "{% endgeneration %}"
            "{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
        ),
        writes=f"{REASONING}\n</think>\n\n{ANSWER}<｜end▁of▁sentence｜>",
        texts=("<think>", "</think>"),
    ),
    "qwq": _family(
        chatml(think=True),
        hub="Qwen/QwQ-32B",
        source="tokenizer_config.json: ChatML, history after </think>, prompt opens <think>\\n",
        specials=("<|endoftext|>", *CHATML),
        bos=None,
        eos="<|im_end|>",
        writes=f"{REASONING}\n</think>\n\n{ANSWER}<|im_end|>",
        texts=("<think>", "</think>"),
    ),
    # the role headers are three words of text; the generation prompt ends at the colon
    "openchat": Family(
        hub="openchat/openchat-3.5-0106",
        source="tokenizer_config.json (GPT4 Correct User: ...<|end_of_turn|>), LLAMA_CPP",
        specials=("<unk>", "<s>", "</s>", "<|end_of_turn|>"),
        bos="<s>",
        eos="<|end_of_turn|>",
        serving=(
            "{{ bos_token }}{% for m in messages %}GPT4 Correct {{ m['role'] | title }}: "
            "{{ m['content'] }}<|end_of_turn|>{% endfor %}"
            "{% if add_generation_prompt %}GPT4 Correct Assistant:{% endif %}"
        ),
        training=(
            "{{ bos_token }}{% for m in messages %}GPT4 Correct {{ m['role'] | title }}:"
            "{% if m['role'] == 'assistant' %}{% generation %} {{ m['content'] }}<|end_of_turn|>"
            "{% endgeneration %}{% else %} {{ m['content'] }}<|end_of_turn|>{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}GPT4 Correct Assistant:{% endif %}"
        ),
        writes=" " + CONTENT + "<|end_of_turn|>",
    ),
    # no end-of-turn token: a turn ends where the next "User:" begins
    "falcon2": Family(
        hub="tiiuae/falcon-11B",
        source="model card (User: ... / Falcon: ...)",
        specials=("<|endoftext|>",),
        bos=None,
        eos="<|endoftext|>",
        serving=(
            "{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
            "{{ {'system': 'System', 'user': 'User', 'assistant': 'Falcon'}[m['role']] }}: "
            "{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '\\n' }}Falcon:{% endif %}"
        ),
        training=(
            "{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
            "{{ {'system': 'System', 'user': 'User', 'assistant': 'Falcon'}[m['role']] }}:"
            "{% if m['role'] == 'assistant' %}{% generation %} {{ m['content'] }}"
            "{% endgeneration %}{% else %} {{ m['content'] }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ '\\n' }}Falcon:{% endif %}"
        ),
        writes=" " + CONTENT,
    ),
    "exaone": Family(
        hub="LGAI-EXAONE/EXAONE-3.5-7.8B-Instruct",
        source="tokenizer_config.json ([|user|], [|assistant|], [|endofturn|]), LLAMA_CPP",
        specials=("[PAD]", "[|system|]", "[|user|]", "[|assistant|]", "[|endofturn|]"),
        bos=None,
        eos="[|endofturn|]",
        serving=(
            "{% for m in messages %}{% if m['role'] == 'system' %}"
            "[|system|]{{ m['content'] }}[|endofturn|]\n"
            "{% elif m['role'] == 'user' %}[|user|]{{ m['content'] }}\n"
            "{% else %}[|assistant|]{{ m['content'] }}[|endofturn|]\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}[|assistant|]{% endif %}"
        ),
        training=(
            "{% for m in messages %}{% if m['role'] == 'system' %}"
            "[|system|]{{ m['content'] }}[|endofturn|]\n"
            "{% elif m['role'] == 'user' %}[|user|]{{ m['content'] }}\n"
            "{% else %}[|assistant|]{% generation %}{{ m['content'] }}[|endofturn|]"
            "{% endgeneration %}{{ '\\n' }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}[|assistant|]{% endif %}"
        ),
        writes=CONTENT + "[|endofturn|]",
    ),
    # a default system prompt (knowledge cutoff, identity) when the conversation has none
    "granite": Family(
        hub="ibm-granite/granite-3.1-8b-instruct",
        source="tokenizer_config.json (<|start_of_role|>role<|end_of_role|>); LLAMA_CPP's granite",
        specials=("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"),
        bos=None,
        eos="<|end_of_text|>",
        serving=(
            "{% if messages[0]['role'] != 'system' %}<|start_of_role|>system<|end_of_role|>"
            "Knowledge Cutoff Date: April 2024. You are Granite, developed by IBM."
            "<|end_of_text|>\n{% endif %}{% for m in messages %}"
            "<|start_of_role|>{{ m['role'] }}<|end_of_role|>{{ m['content'] }}<|end_of_text|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>"
            "{% endif %}"
        ),
        training=(
            "{% if messages[0]['role'] != 'system' %}<|start_of_role|>system<|end_of_role|>"
            "Knowledge Cutoff Date: April 2024. You are Granite, developed by IBM."
            "<|end_of_text|>\n{% endif %}{% for m in messages %}"
            "<|start_of_role|>{{ m['role'] }}<|end_of_role|>"
            "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|end_of_text|>"
            "{% endgeneration %}{% else %}{{ m['content'] }}<|end_of_text|>{% endif %}{{ '\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>"
            "{% endif %}"
        ),
        writes=CONTENT + "<|end_of_text|>",
    ),
    # no end-of-turn token: a turn ends in a newline, the next turn's <extra_id_1> follows
    "nemotron_mini": Family(
        hub="nvidia/Nemotron-Mini-4B-Instruct",
        source="model card (<extra_id_0>System, <extra_id_1>User / Assistant)",
        specials=("<pad>", "<s>", "</s>", "<extra_id_0>", "<extra_id_1>"),
        bos="<s>",
        eos="</s>",
        serving=(
            "{% for m in messages %}{% if m['role'] == 'system' %}"
            "<extra_id_0>System\n{{ m['content'] }}\n\n"
            "{% else %}<extra_id_1>{{ m['role'] | title }}\n{{ m['content'] }}\n{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}<extra_id_1>Assistant\n{% endif %}"
        ),
        training=(
            "{% for m in messages %}{% if m['role'] == 'system' %}"
            "<extra_id_0>System\n{{ m['content'] }}\n\n"
            "{% elif m['role'] == 'user' %}<extra_id_1>User\n{{ m['content'] }}\n"
            "{% else %}<extra_id_1>Assistant\n{% generation %}{{ m['content'] }}\n"
            "{% endgeneration %}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}<extra_id_1>Assistant\n{% endif %}"
        ),
        writes=CONTENT + "\n",
    ),
}
