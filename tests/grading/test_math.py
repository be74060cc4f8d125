"""Math answers graded by the real math-verify: extraction, equivalence, think handling,
timeouts."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from stillroom.grading import Grade, grade_math
from stillroom.grading import math as math_grader


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (r"So the total is \boxed{7}.", "7"),
        (r"\boxed{\frac{1}{2}}", "0.5"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{1,000}", "1000"),
        (r"\boxed{1000}", "1,000"),
        (r"\boxed{3\sqrt{3}}", r"3\sqrt{3}"),
        (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}"),
        (r"The roots are $\boxed{3, 2}$", "2, 3"),
        ("The answer is 42.", "42"),
    ],
)
def test_math_equivalent_forms_are_correct(response, gold):
    g = grade_math(response, gold)
    assert g.status == "ok" and g.correct, g
    assert g.extracted


def test_math_wrong_answer_is_ok_but_incorrect():
    assert grade_math(r"I think \boxed{8}", "7") == Grade(False, "8", "ok")


def test_math_gold_is_parsed_whole():
    # A bare "3\sqrt{3}" parses as 3; the grader must not accept 3 for it.
    assert not grade_math(r"\boxed{3}", r"3\sqrt{3}").correct


def test_math_boxed_wins_over_earlier_answer_phrase():
    g = grade_math(r"Answer: 8. On reflection the result is \boxed{7}", "7")
    assert (g.correct, g.extracted) == (True, "7")


def test_math_think_block_is_ignored():
    g = grade_math(r"<think>maybe \boxed{7}</think> Final: \boxed{8}", "7")
    assert (g.correct, g.extracted, g.status) == (False, "8", "ok")


def test_math_last_close_think_wins():
    r = r"<think>\boxed{1}</think> \boxed{2} <think>again</think> \boxed{7}"
    assert grade_math(r, "7") == Grade(True, "7", "ok")


@pytest.mark.parametrize(
    "response", [r"<think>so \boxed{7}", r"<think>a</think> b <think> \boxed{7}"]
)
def test_math_unclosed_think_is_no_answer(response):
    assert grade_math(response, "7") == Grade(False, None, "no_answer")


@pytest.mark.parametrize("response", ["", "I do not know.", "<think>hmm</think>"])
def test_math_no_answer(response):
    assert grade_math(response, "7") == Grade(False, None, "no_answer")


@pytest.mark.parametrize("gold", ["", "   "])
def test_math_gold_unparseable(gold):
    g = grade_math(r"\boxed{7}", gold)
    assert g == Grade(False, None, "gold_unparseable", {"gold_problem": "does not parse"})


def test_math_upright_e_is_eulers_number():
    # math-verify alone cuts this gold down to 1: \boxed{1} was right and the true answer wrong.
    gold = r"1-\frac{1}{\mathrm{e}}"
    assert not grade_math(r"\boxed{1}", gold).correct
    assert grade_math(r"\boxed{1-\frac1e}", gold).correct
    assert grade_math(r"\boxed{\frac{e-1}{\mathrm{e}}}", gold).correct


@pytest.mark.parametrize(
    ("gold", "reason"),
    [
        (r"\boxed{1} no no no no no \boxed{2}", "parses to {1, 2} (read from '1,2')"),
        ("12:00", "parses to zoo, an undefined value"),
        (r"\boxed{3} apples", None),  # prose around one box: the box is the gold
        (
            r"1-\frac{1}{\mathrm{x}}",
            "parses to 1 (read from '1-\\\\frac{1}{'), not to its whole text",
        ),
    ],
)
def test_math_gold_that_is_not_its_text_is_a_gold_problem(gold, reason):
    g = grade_math(r"\boxed{3}", gold)
    if reason is None:
        assert (g.status, g.correct) == ("ok", True)
    else:
        assert (g.status, g.correct) == ("gold_unparseable", False), g
        assert reason in g.details["gold_problem"], g.details


def test_math_gold_boxes_are_not_joined_across_words():
    # Math-Verify's own tests expect this pair graded wrong: the gold's words are not a set.
    g = grade_math(r"\boxed{1,2}", r"\boxed{1} no no no no no \boxed{2}")
    assert g.status == "gold_unparseable" and not g.correct
    assert grade_math(r"\boxed{1,2}", r"\boxed{1} and \boxed{2}").correct


@pytest.mark.parametrize(
    "gold",
    [
        r"\frac{\sqrt{3}}{2}",
        r"\text{(C)}",
        r"5\text{ cm}^2",
        r"\left(3, \frac{\pi}{2}\right)",
        r"[2,5)",
        r"10\%",
        r"\$1.50",
        r"y = 2x + 3",
        r"x \in (0, 1]",
        r"\text{Even}",
        "a=1, b=2",
        r"30^\circ",
        r"\mathrm{cm}",
        r"\begin{pmatrix}1\\2\end{pmatrix}",
        "19, 46, and 82",
    ],
)
def test_math_golds_of_usual_forms_parse_whole(gold):
    g = grade_math(rf"\boxed{{{gold}}}", gold)
    assert (g.status, g.correct) == ("ok", True), g


def test_math_last_boxed_is_the_answer():
    response = r"\boxed{7} is wrong; the final answer is \boxed{8}"
    assert grade_math(response, "8") == Grade(True, "8", "ok")
    assert not grade_math(response, "7").correct
    # all: math-verify joins the boxes into the set {7, 8}
    assert not grade_math(response, "8", boxed="all").correct
    assert grade_math(response, "7, 8", boxed="all").correct


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (r"\boxed{1\,000}", "1000"),
        (r"\boxed{1\ 000}", "1000"),
        (r"\boxed{1{,}000}", "1000"),
        (r"\boxed{12\,345\,678}", "12345678"),
        (r"\boxed{1000}", r"1\,000"),
        (r"\boxed{11,\!111}", "11111"),
    ],
)
def test_math_digit_groups(response, gold):
    assert grade_math(response, gold).correct


def test_math_short_groups_are_not_thousands():
    # "1,2" is a set and "1\,5" not a number with a thousands separator.
    assert grade_math(r"\boxed{1,2}", "1, 2").correct
    assert not grade_math(r"\boxed{1,2}", "12").correct
    assert not grade_math(r"\boxed{1\,5}", "15").correct


@pytest.mark.parametrize("gold", ["7", "0.5"])  # 0.5: compared relatively, still in time
def test_math_timeout_is_reported(monkeypatch, gold):
    monkeypatch.setattr(math_grader, "TIMEOUT_S", 1)
    g = grade_math(r"\boxed{9^{9^{9^{9}}}}", gold)
    assert g.status == "timeout" and not g.correct


def test_math_grades_from_a_thread():
    assert threading.current_thread() is threading.main_thread()
    cases = [(r"\boxed{0.5}", r"\frac{1}{2}"), (r"\boxed{8}", "7"), ("nothing", "7")]
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda c: grade_math(*c), cases))
    assert [(g.correct, g.status) for g in got] == [
        (True, "ok"),
        (False, "ok"),
        (False, "no_answer"),
    ]


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (r"\boxed{4.4 \times 10^{7}}", "4.4e7"),
        (r"\boxed{44000000}", "4.4e7"),
        ("The answer is 4.4e7.", "44000000"),
        (r"The answer is $4.4\cdot10^7$.", "4.4E7"),
        (r"The speed is 4.4 \times 10^{7} m/s.", "4.4e7"),
        (r"\boxed{0.00000044}", "4.4E-7"),
        (r"\boxed{4.4 \times 10^{-7}}", "4.4e-7"),
        (r"\boxed{1e-3}", "10^{-3}"),
        (r"\boxed{10^{-3}}", "0.001"),
        (r"\boxed{3\times10^8}", r"3 \times 10^{8} \mathrm{~m} \mathrm{~s}^{-1}"),
        (r"\boxed{10^{400}}", "1e400"),
    ],
)
def test_math_scientific_notation_is_the_number(response, gold):
    g = grade_math(response, gold)
    assert (g.status, g.correct) == ("ok", True), g


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (r"\boxed{4.4e8}", "4.4e7"),
        (r"\boxed{8.8 \times 10^{7}}", "4.4e7"),
        (r"\boxed{4.4 \cdot e \cdot 7}", "4.4e7"),  # what 4.4e7 used to be read as
        (r"\boxed{1/2000}", r"1/2 \times 10^3"),  # the division binds first: 500
        (r"\boxed{x^{2000}}", r"x^2 \times 10^3"),
    ],
)
def test_math_scientific_notation_is_not_another_number(response, gold):
    g = grade_math(response, gold)
    assert (g.status, g.correct) == ("ok", False), g


@pytest.mark.parametrize(
    ("response", "gold", "correct"),
    [
        # e alone is Euler's number: 2e is 2·e, e^{2} and 2e^{3} are powers of e
        (r"\boxed{2e}", "2e", True),
        (r"\boxed{5.436564}", "2e", True),
        (r"\boxed{e^2}", "e^{2}", True),
        (r"\boxed{7.389056}", "e^{2}", True),
        (r"\boxed{2e^{3}}", "2e^{3}", True),
        (r"\boxed{2000}", "2e^{3}", False),
        # digits, e and an integer exponent with nothing between is scientific notation
        (r"\boxed{2000}", "2e3", True),
        (r"\boxed{2e \cdot 3}", "2e3", False),
    ],
)
def test_math_eulers_e_where_it_is_meant(response, gold, correct):
    g = grade_math(response, gold)
    assert (g.status, g.correct) == ("ok", correct), g


@pytest.mark.parametrize(
    ("response", "gold", "correct"),
    [
        (r"\boxed{8.224e-19}", "8.224e-18", False),  # 10x off
        (r"\boxed{9.1e-31}", "1.6e-19", False),
        (r"\boxed{3.2e-19}", "1.6e-19", False),  # 2x off
        (r"\boxed{1.6 \times 10^{-19}}", "1.6e-19", True),
        (r"\boxed{1.6000001e-19}", "1.6e-19", True),  # 6e-8 apart, relatively
        (r"\boxed{1.60001e-19}", "1.6e-19", False),  # 6e-6 apart
        (r"\boxed{0.000002}", "0.000001", False),
        (r"\boxed{0.00000002}", "0.00000001", False),  # 6 decimal places made both 0
        (r"\boxed{0.000000010000001}", "0.00000001", True),
        (r"\boxed{0.333333}", r"\frac{1}{3}", True),
        (r"\boxed{0.33333}", r"\frac{1}{3}", False),
        # a gold rounded to 6 significant digits is the exact value, to 5 it is not
        (r"\boxed{\frac{5}{24}}", "0.208333", True),
        (r"\boxed{\frac{22}{21}}", "1.04762", True),
        (r"\boxed{\frac{5}{24}}", "0.20833", False),
        (r"\boxed{1.00001}", "1.000005", True),  # 5e-6 apart, within 5e-6 of 1.00001
        (r"\boxed{1.4142136}", r"\sqrt{2}", True),
        (r"\boxed{4.4e22}", "4.4e22", True),
    ],
)
def test_math_decimals_compare_relatively(response, gold, correct):
    g = grade_math(response, gold)
    assert (g.status, g.correct) == ("ok", correct), g


@pytest.mark.parametrize(
    ("response", "correct"),
    [
        (r"\boxed{1000001}", False),
        (r"\boxed{1000000.5}", False),
        (r"\boxed{1000001.0}", False),
        (r"\boxed{999999}", False),
        (r"\boxed{1000000.0}", True),
        (r"\boxed{10^6}", True),
    ],
)
def test_math_whole_numbers_compare_exactly(response, correct):
    g = grade_math(response, "1000000")
    assert (g.status, g.correct) == ("ok", correct), g


def test_math_info_records_the_tolerance():
    from stillroom.grading.result import Options

    options = math_grader.info(Options.parse({}))["options"]
    assert options["rel_tol"] == 5e-6 and options["float_rounding"] == 6


@pytest.mark.parametrize(
    ("response", "gold", "correct"),
    [
        (r"\boxed{52_9}", "52_9", True),
        (r"\boxed{52}", "52_9", True),  # the digits asked for, read in the gold's base
        (r"\boxed{52_8}", "52_9", False),
        (r"\boxed{52_{10}}", "52_9", False),
        (r"\boxed{47}", "52_9", False),  # its value in base 10: not what was asked
        (r"\boxed{10001_2}", "10001_{2}", True),
        (r"\boxed{1011_{3}}", "1011_{2}", False),
        (r"\boxed{A3_{16}}", "A3_{16}", True),
        (r"\boxed{A3_{17}}", "A3_{16}", False),
        (r"\boxed{52_{10}}", "52", True),
        (r"\boxed{52_9}", "52", False),
        (r"\boxed{x_2 + 1}", "x_2 + 1", True),  # a subscripted variable is no base
    ],
)
def test_math_base_subscripts(response, gold, correct):
    g = grade_math(response, gold)
    assert (g.status, g.correct) == ("ok", correct), g


@pytest.mark.parametrize(
    ("gold", "reason"),
    [
        ("unparseable_latex", "keeps 'unparseable_latex' as text"),
        (r"\boxed{5", "its braces do not balance"),
        ("one half", "parses 'half', 'one' as products of letters"),
        ("MR=SRMC", "parses 'SRMC' as products of letters"),
        (r"\hbar \omega(v+1 / 2)-\frac{E_{0}^{2} e^{2}}{2 m \omega^{2}}", "parses to 2, without"),
    ],
)
def test_math_golds_that_do_not_parse_are_named(gold, reason):
    for response in (r"\boxed{2}", r"\boxed{0.5}", rf"\boxed{{{gold}}}"):
        g = grade_math(response, gold)
        assert (g.status, g.correct) == ("gold_unparseable", False), g
        assert reason in g.details["gold_problem"], g.details


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (r"\boxed{0.35625}", ".35625"),
        (r"\boxed{.35625}", "0.35625"),
        (r"\boxed{-0.5}", "-.5"),
        (r"\boxed{7.5}", r"7.5 \mathrm{~m}^{-2}"),
        (r"\boxed{7.5 \mathrm{~m}^{-2}}", r"7.5 \mathrm{~m}^{-2}"),
        (r"\boxed{2.5}", r"2.5 \mathrm{~kg} \mathrm{~m}^{2}"),
        (r"\boxed{S_{MBCN} = 7}", "S_{MBCN} = 7"),  # a subscript is a name, not a word
    ],
)
def test_math_golds_that_read_correctly_are_graded(response, gold):
    g = grade_math(response, gold)
    assert (g.status, g.correct) == ("ok", True), g
