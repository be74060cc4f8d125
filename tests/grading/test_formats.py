"""How a problem is asked and where its answer is read: the program of a coding answer, the kernel
instruction around a problem's source and the ModelNew block of a kernel answer."""

from stillroom.grading.formats import (
    extract_code,
    extract_program,
    kernel_instruction,
    user_content,
)

from ..conftest import kernel_records


def test_extracts_last_python_block_else_bare_block_else_whole_answer():
    two = "```python\nx = 1\n```\ntext\n```py\nx = 2\n```\n```bash\nls\n```"
    assert extract_program(two) == "x = 2\n"
    assert extract_program("```\nx = 3\n```") == "x = 3\n"
    assert (
        extract_program("- item:\n  ```python\n  def f():\n      return 1\n  ```")
        == "def f():\n    return 1\n"
    )
    assert extract_program("x = 4\n") == "x = 4"
    assert (
        extract_program("<think>```python\nx = 5\n```</think>\n```python\nx = 6\n```") == "x = 6\n"
    )
    assert extract_program("<think>still going ```python\nx = 7\n```") is None
    assert extract_program("<think>done</think>   ") is None


def test_instruction_wraps_the_source_and_extract_code_finds_modelnew():
    rec = kernel_records(["relu"])[0]
    asked = user_content(rec)
    assert (
        asked == kernel_instruction(rec["prompt"])
        and "`ModelNew`" in asked
        and rec["prompt"].strip() in asked
    )
    assert user_content({"kind": "math", "prompt": "1+1?"}) == "1+1?"
    answer = (
        "<think>draft:\n```python\nclass ModelNew: pass\n```</think>\n"
        "Helper:\n```python\nx = 1\n```\n"
        "Final:\n```python\nimport torch\nclass ModelNew(torch.nn.Module): ...\n```\n"
        "and a tail\n```\ny\n```"
    )
    assert extract_code(answer).startswith(
        "import torch\nclass ModelNew"
    )  # after the reasoning, defines ModelNew
    assert extract_code("```py\nz = 2\n```") == "z = 2\n"
    assert extract_code("<think>never closed ```python\nclass ModelNew: pass\n```") is None
    assert extract_code("no code at all") is None


def test_the_effort_tag_goes_in_a_system_turn_or_heads_the_user_turn():
    from stillroom.grading.formats import with_effort_tag

    turns = [{"role": "user", "content": "What is 2 + 5?"}, {"role": "assistant", "content": "7"}]
    assert with_effort_tag(turns, "{effort: high}") == [
        {"role": "system", "content": "{effort: high}"},
        *turns,
    ]
    assert with_effort_tag(turns, "{effort: high}", "user") == [
        {"role": "user", "content": "{effort: high}\nWhat is 2 + 5?"},
        turns[1],
    ]
    assert with_effort_tag(turns, None, "user") == turns
    assert turns[0]["content"] == "What is 2 + 5?"  # the caller's messages are left as they were
