from stillroom.ids import normalize_prompt, prompt_id


def test_prompt_id_is_stable_and_normalised():
    assert prompt_id("What is  2 + 2?\n", "s") == prompt_id("What is 2 + 2?", "s")
    assert prompt_id("What is 2 + 2?", "s") != prompt_id("What is 2 + 2?", "t")
    assert prompt_id("What is 2 + 2?", "s") != prompt_id("what is 2 + 2?", "s")  # case kept
    assert normalize_prompt(" a\t b \n") == "a b"
    assert len(prompt_id("x", "s")) == 16
