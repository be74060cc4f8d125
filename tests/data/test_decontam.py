"""Tests for stillroom.data.decontam: normalisation, exact n-gram matching, both scan paths,
hash-collision safety."""

from __future__ import annotations

import random

import pytest

from stillroom.data.decontam import Match, NgramIndex, normalize_words
from stillroom.io import DataError

from ..conftest import kernel_records

WORDS = [f"w{i}" for i in range(1, 40)]
ITEM = " ".join(WORDS[:20])  # 20 distinct words: 8 different 13-grams
GRAM0 = " ".join(WORDS[:13])


def naive(benchmarks, n):
    """Reference matcher: every window of the text as a word tuple, against all item windows (whole
    item if short)."""
    grams = {}
    for name, items in benchmarks.items():
        for i, item in enumerate(items):
            words = normalize_words(item)
            m = min(n, len(words))
            for j in range(len(words) - m + 1 if words else 0):
                grams.setdefault(tuple(words[j : j + m]), set()).add((name, i))
    lengths = {len(g) for g in grams}

    def found(text):
        words, out = normalize_words(text), set()
        for m in lengths:
            for j in range(len(words) - m + 1):
                out |= {
                    (b, i, " ".join(words[j : j + m]))
                    for b, i in grams.get(tuple(words[j : j + m]), ())
                }
        return out

    return found


def as_sets(scanned):
    return [{(m.benchmark, m.item, m.ngram) for m in ms} for ms in scanned]


class Numpy(NgramIndex):
    _SMALL_CHARS = 0  # always the numpy path


class Python(NgramIndex):
    _SMALL_CHARS = 1 << 62  # always the pure-Python path


class Collide(Numpy):
    # word hash = byte sum, gram hash = sum of word hashes: anagrams and reorderings all collide
    _P = 1


def random_corpus(rng, vocab, count, lo=5, hi=60):
    seps = [" ", "  ", ", ", ". ", "\n", "\t", "-", "'", "_", "\x01", "…", " — "]
    out = []
    for _ in range(count):
        words = [rng.choice(vocab) for _ in range(rng.randint(lo, hi))]
        words = [w.upper() if rng.random() < 0.1 else w for w in words]
        out.append("".join(w + rng.choice(seps) for w in words))
    return out


# --- normalisation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, words",
    [
        ("Hello WORLD", ["hello", "world"]),
        ("  many\t\n spaces\r\nhere ", ["many", "spaces", "here"]),
        ("x=3.5, don't; snake_case!", ["x", "3", "5", "don", "t", "snake", "case"]),
        ("Ｆｕｌｌｗｉｄｔｈ ﬁne", ["fullwidth", "fine"]),  # NFKC
        ("Cafe\u0301 CAFÉ café", ["café", "café", "café"]),  # combining accent composed by NFKC
        ("ΟΔΟΣ Straße 東京 ١٢٣", ["οδος", "straße", "東京", "١٢٣"]),
        ("a\x01b\x00c", ["a", "b", "c"]),  # control characters separate words
        ("", []),
        ("?!... ---", []),
    ],
)
def test_normalize_words(text, words):
    assert normalize_words(text) == words


# --- matching semantics ---------------------------------------------------------------------------


@pytest.fixture(params=[Numpy, Python], ids=["numpy", "python"])
def Index(request):
    return request.param


def test_exact_13gram_hit(Index):
    ix = Index({"math": ["unrelated item text here", ITEM]})
    assert ix.matches(f"Prefix words then {GRAM0} and more") == [Match("math", 1, GRAM0)]
    assert ix.contaminated(f"Prefix words then {GRAM0} and more")


def test_twelve_shared_words_do_not_match(Index):
    ix = Index({"math": [ITEM]})
    text = (
        " ".join(WORDS[:12]) + " other " + " ".join(WORDS[13:24])
    )  # 12 + 7 shared, never 13 in a row
    assert ix.matches(text) == []
    assert not ix.contaminated(text)
    assert ix.matches(" ".join(WORDS[1:13])) == []  # 12 words, fewer than n


def test_matches_across_case_and_punctuation(Index):
    ix = Index({"b": [ITEM.replace("w5 ", "w5, ").replace("w9", "W9!")]})
    text = "Q: " + "...".join(w.upper() for w in WORDS[:13]) + "?"
    assert ix.matches(text) == [Match("b", 0, GRAM0)]


def test_multiple_benchmarks_items_dedup_and_order(Index):
    shared = " ".join(WORDS[20:33])
    benchmarks = {
        "zeta": ["nothing to see", f"intro {shared} outro"],
        "alpha": [f"{shared} tail words", ITEM, f"{shared}"],
    }
    ix = Index(benchmarks)
    g1 = " ".join(WORDS[1:14])
    # order is benchmark name, item, then first position (g1 precedes GRAM0 although it also occurs
    # last)
    text = f"{g1} and then {shared}. Again: {shared}; and {GRAM0} and {g1}"
    assert ix.matches(text) == [
        Match("alpha", 0, shared),
        Match("alpha", 1, g1),
        Match("alpha", 1, GRAM0),
        Match("alpha", 2, shared),
        Match("zeta", 1, shared),
    ]
    assert as_sets([ix.matches(text)]) == [naive(benchmarks, 13)(text)]


def test_item_repeating_its_own_ngram_is_reported_once(Index):
    ix = Index({"b": [f"{GRAM0} x {GRAM0}"]})
    assert ix.matches(f"{GRAM0} {GRAM0}") == [Match("b", 0, GRAM0)]


def test_short_items_match_only_as_a_whole(Index):
    ix = Index({"b": ["What is 2+2?", "", "?!", ITEM]})
    assert ix.lengths == [13, 4]  # empty and punctuation-only items are not indexed
    assert ix.matches("please tell me: what IS 2 + 2") == [Match("b", 0, "what is 2 2")]
    assert ix.matches("what is 2 3") == []
    assert ix.matches("what is 22") == []
    assert not ix.contaminated("what is the answer, 2 2")
    assert ix.matches("") == []


def test_other_n(Index):
    ix = Index({"b": ["the quick brown fox jumps"]}, n=3)
    assert [m.ngram for m in ix.matches("a quick brown fox jumps over the quick brown")] == [
        "quick brown fox",
        "brown fox jumps",
        "the quick brown",
    ]
    assert Index({"b": ["one"]}, n=1).matches("zero ONE two") == [Match("b", 0, "one")]
    with pytest.raises(ValueError):
        Index({"b": ["x"]}, n=0)


def test_bad_benchmarks_are_data_errors():
    with pytest.raises(DataError, match="'gsm': expected a sequence of strings"):
        NgramIndex({"gsm": "a single question"})
    with pytest.raises(DataError, match="'gsm' item 1: expected a string, got NoneType"):
        NgramIndex({"gsm": ["fine", None]})


def test_no_window_spans_two_texts():
    ix = Numpy({"b": [ITEM]})
    half = " ".join(WORDS[:7]), " ".join(WORDS[7:13])
    assert ix.scan([half[0], half[1], GRAM0]) == [[], [], [Match("b", 0, GRAM0)]]


# --- the two paths, batch scan and hash collisions agree with the naive reference -----------------


def _benchmarks(rng, vocab):
    def items(k):
        return [" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 30))) for _ in range(k)]

    return {"gsm": items(40), "math": items(40), "aime": items(10)}


@pytest.mark.parametrize("n", [13, 4])
def test_scan_agrees_with_matches_contaminated_and_naive(n):
    rng = random.Random(n)
    vocab = ["α", "ΟΔΟΣ", "Straße", "ﬁne", "Ｆｕｌｌ", "Cafe\u0301", "x1", "7", "the", "of", "a"]
    vocab += [f"v{i}" for i in range(8)]
    benchmarks = _benchmarks(rng, vocab)
    corpus = random_corpus(rng, vocab + ["zz", "yy"], 300)
    # plant item passages so there are hits of both kinds (n-grams and whole short items)
    corpus += [
        f"{rng.choice(corpus)} {rng.choice(items)} {rng.choice(corpus)}"
        for items in benchmarks.values()
    ]
    fast, slow, default = Numpy(benchmarks, n), Python(benchmarks, n), NgramIndex(benchmarks, n)
    batch = fast.scan(corpus)
    assert (
        batch == slow.scan(corpus) == default.scan(corpus) == [default.matches(t) for t in corpus]
    )
    assert (
        [bool(m) for m in batch]
        == [fast.contaminated(t) for t in corpus]
        == [slow.contaminated(t) for t in corpus]
    )
    assert as_sets(batch) == list(map(naive(benchmarks, n), corpus))
    assert sum(map(bool, batch)) > 10  # the test exercises real hits


def test_hash_collisions_never_give_false_hits():
    rng = random.Random(0)
    vocab = [
        "ab",
        "ba",
        "a",
        "b",
        "aab",
        "c",
        "abc",
        "cab",
    ]  # many byte-sum (anagram) collisions under _P = 1
    benchmarks = {"b": [" ".join(rng.choice(vocab) for _ in range(13)) for _ in range(20)]}
    ix = Collide(benchmarks)
    reordered = [" ".join(reversed(item.split())) for item in benchmarks["b"]]
    gram_hash = lambda text: ix._window_hashes(ix._tokens([text])[3], 13)[0]  # noqa: E731
    assert all(
        gram_hash(a) == gram_hash(b) for a, b in zip(benchmarks["b"], reordered, strict=False)
    )  # collisions do occur
    corpus = random_corpus(random.Random(1), vocab, 2000, 10, 40) + reordered
    found = ix.scan(corpus)
    assert as_sets(found) == list(map(naive(benchmarks, 13), corpus))
    assert found == Numpy(benchmarks).scan(corpus)


def test_large_random_corpus_no_false_positives():
    rng = random.Random(2)
    vocab = [f"w{i}" for i in range(50)]
    benchmarks = {
        f"b{k}": [" ".join(rng.choice(vocab) for _ in range(30)) for _ in range(50)]
        for k in range(3)
    }
    corpus = random_corpus(rng, vocab, 3000, 10, 80)
    found = NgramIndex(benchmarks).scan(corpus)
    assert as_sets(found) == list(map(naive(benchmarks, 13), corpus))
    planted = [f"{corpus[0]} {benchmarks['b1'][7]}"]
    assert (
        Match("b1", 7, " ".join(benchmarks["b1"][7].split()[:13]))
        in NgramIndex(benchmarks).scan(planted)[0]
    )


def test_decontam_ignores_boilerplate_shared_by_many_items():
    """Every problem file shares its imports and class header: with them indexed, any two problems
    'overlap'; n-grams shared by more than one benchmark item are ignored, so only real overlap
    counts."""
    srcs = {r["meta"]["problem"]: r["prompt"] for r in kernel_records(None)}
    bench = [srcs["relu"], srcs["tanh"], srcs["sigmoid"]]
    plain, kept = NgramIndex({"b": bench}, n=13), NgramIndex({"b": bench}, n=13, max_items=1)
    assert all(plain.contaminated(s) for s in srcs.values())  # every file "overlaps" every other
    assert not kept.contaminated(srcs["matmul"]) and kept.ignored > 0
    assert kept.contaminated(srcs["relu"].replace("16", "32"))  # a near copy still matches
