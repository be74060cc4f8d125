"""Exact n-gram decontamination of prompts against benchmark items.

Text is normalised by :func:`normalize_words`; an n-gram is ``n`` consecutive normalised words. A
prompt is contaminated by a benchmark item when they share an n-gram (default 13, as in GPT-3 /
Llama decontamination). Matches are deduplicated per (benchmark, item, ngram) and sorted by
benchmark name, item, then the position of the n-gram's first occurrence in the text.

Items with fewer than ``n`` words (but at least one) are indexed as one whole-item gram, so a short
benchmark question is still caught when a prompt contains all of it verbatim; an item of 2 words
therefore matches any text containing those 2 words in a row. A text with fewer words than the
shortest indexed gram has no hits. Items with no words are ignored.

Matching is exact. ``scan`` normalises a chunk of texts as one string, and numpy computes a 64-bit
polynomial hash of every word (over its UTF-8 bytes), then of every window of word hashes. A bitmap
of the index's gram hashes rejects almost all windows; a survivor counts only if its normalised
words are a key of the gram dict, so hash collisions cost time but never produce a false hit.
Inputs under ``_SMALL_CHARS`` (a single prompt, say) skip numpy and look up each window made only
of benchmark words in that dict directly.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..config import Decontam
from ..io import DataError

__all__ = ["Match", "NgramIndex", "normalize_words"]

# Joins the texts of a chunk; a separator inside a text, so texts' own copies become spaces.
_SEP = "\x01"
# A word is a maximal run of Unicode letters/digits; every other character (punctuation, symbols,
# "_", whitespace) separates words, so "3.5" -> ["3", "5"] and "don't" -> ["don", "t"].
_ASCII_NON_WORD = str.maketrans(
    {chr(c): " " for c in range(128) if not chr(c).isalnum() and chr(c) != _SEP}
)
_NON_WORD = re.compile(rf"[^\w{_SEP}]|_")
_BIT = (1 << np.arange(8)).astype(np.uint8)  # bit masks for the packed bitmap


def _canon(text: str) -> str:
    """NFKC, lowercase, every non-word character except _SEP replaced by a space."""
    if text.isascii():  # fast path, same result as the regex on ASCII
        return text.lower().translate(_ASCII_NON_WORD)
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower())


def normalize_words(text: str) -> list[str]:
    """NFKC-normalise (full-width forms, ligatures, composed accents), lowercase, split into
    words."""
    return _canon(text).replace(_SEP, " ").split()


@dataclass(frozen=True)
class Match:
    benchmark: str  # the benchmark's name (key of the mapping)
    item: int  # index into that benchmark's sequence
    ngram: str  # the normalised n-gram, words joined by single spaces


class NgramIndex:
    """Index of benchmark n-grams; ``matches``/``scan`` report every shared n-gram,
    ``contaminated`` any."""

    _P = 0x9E3779B97F4A7C15  # odd hash multiplier, so it is invertible mod 2**64
    _BITMAP_SLOTS = 256
    _SMALL_CHARS = 1500  # below this many characters a Python loop beats numpy (measured)
    _CHUNK_CHARS = 1 << 17  # characters per numpy pass in scan(); bounds memory

    def __init__(
        self,
        benchmarks: Mapping[str, Sequence[str]],
        n: int = Decontam().ngram,
        max_items: int | None = None,
    ):
        """``max_items``: n-grams shared by more items than this are boilerplate (a code file's
        imports and class header), which identifies no item; they are dropped, as GPT-3 dropped
        frequent 13-grams."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = n
        self._pow = self._ipow = np.ones(1, dtype=np.uint64)
        # gram words -> [(benchmark, item), ...]
        self._grams: dict[tuple[str, ...], list[tuple[str, int]]] = {}
        self._vocab: set[str] = set()  # words of the benchmarks
        owners, texts = [], []
        for name, items in benchmarks.items():
            # one string would silently index each character as an item
            if isinstance(items, str):
                raise DataError(
                    f"benchmark {name!r}: expected a sequence of strings, got one string"
                )
            for item, text in enumerate(items):
                if not isinstance(text, str):
                    raise DataError(
                        f"benchmark {name!r} item {item}: expected a string, "
                        f"got {type(text).__name__}"
                    )
                owners.append((name, item))
                texts.append(text)
        _, starts, _, word_hash = self._tokens(texts)
        hashes: dict[int, list[np.ndarray]] = {}  # gram length -> gram hashes
        first = 0  # index of the item's first word in the flat word arrays
        for owner, text in zip(owners, texts, strict=True):
            words = normalize_words(text)
            if words:
                self._vocab.update(words)
                m = min(n, len(words))
                for i in range(len(words) - m + 1):
                    entry = self._grams.setdefault(tuple(words[i : i + m]), [])
                    if owner not in entry:  # a gram repeated inside one item counts once
                        entry.append(owner)
                hashes.setdefault(m, []).append(
                    self._window_hashes(word_hash[first : first + len(words)], m)
                )
            first += len(words)
        assert first == len(starts), "batch and single-text normalisation disagree"
        self.ignored = 0
        if max_items is not None:
            # the bitmap keeps their hashes: a survivor must still be a key of _grams
            common = [g for g, owners in self._grams.items() if len(owners) > max_items]
            for g in common:
                del self._grams[g]
            self.ignored = len(common)
        # window lengths to scan: n, then short-item lengths
        self.lengths = sorted(hashes, reverse=True)
        # ~BITMAP_SLOTS slots per gram: the bitmap's false-positive rate is about
        # 1 / (BITMAP_SLOTS / 2)
        self._bits = int(
            np.clip(np.ceil(np.log2(max(len(self._grams), 1) * self._BITMAP_SLOTS)), 16, 28)
        )
        bitmap = np.zeros(1 << self._bits, dtype=bool)
        for hs in hashes.values():
            bitmap[np.concatenate(hs) >> np.uint64(64 - self._bits)] = True
        # 8x smaller than bools: fewer cache misses
        self._bitmap = np.packbits(bitmap, bitorder="little")

    def __len__(self) -> int:
        """Number of distinct indexed grams."""
        return len(self._grams)

    def _powers(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """P**i and P**-i mod 2**64 for i < size (uint64 products wrap mod 2**64, which is what we
        want)."""
        if len(self._pow) < size:
            size = max(size, 2 * len(self._pow))  # grow geometrically
            pows = np.full((2, size), [[self._P], [pow(self._P, -1, 1 << 64)]], dtype=np.uint64)
            pows[:, 0] = 1
            self._pow, self._ipow = np.cumprod(pows, axis=1)
        return self._pow, self._ipow

    def _prefix(self, values: np.ndarray) -> np.ndarray:
        """prefix[j] = sum_{i<j} values[i] * P**i, so a span's hash is
        (prefix[b] - prefix[a]) * P**-a."""
        pw, _ = self._powers(len(values) + 1)
        prefix = np.zeros(len(values) + 1, dtype=np.uint64)
        np.multiply(values, pw[: len(values)], out=prefix[1:])
        np.cumsum(prefix[1:], out=prefix[1:])
        return prefix

    def _window_hashes(
        self, word_hash: np.ndarray, m: int, prefix: np.ndarray | None = None
    ) -> np.ndarray:
        """Hash of every run of m consecutive words: sum_k word_hash[i+k] * P**k mod 2**64."""
        prefix = self._prefix(word_hash) if prefix is None else prefix
        _, ipw = self._powers(len(word_hash) + 1)
        return (prefix[m:] - prefix[:-m]) * ipw[: len(word_hash) - m + 1]

    def _tokens(self, texts: Sequence[str]) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
        """Normalised UTF-8 of the texts joined by _SEP, and each word's start byte, end byte and
        hash."""
        joined = _SEP.join(texts)
        if joined.count(_SEP) != max(len(texts) - 1, 0):
            joined = _SEP.join(text.replace(_SEP, " ") for text in texts)
        raw = _canon(joined).encode()
        arr = np.frombuffer(raw, dtype=np.uint8)
        is_word = np.zeros(len(arr) + 2, dtype=bool)
        is_word[1:-1] = arr > 32  # bytes are now word bytes, " " or _SEP
        edges = np.flatnonzero(is_word[1:] != is_word[:-1])
        starts, ends = edges[::2], edges[1::2]
        prefix = self._prefix(arr)
        return raw, starts, ends, (prefix[ends] - prefix[starts]) * self._ipow[starts]

    def _hits(self, texts: Sequence[str]) -> Iterator[tuple[int, int, tuple[str, ...]]]:
        """Yield (text index, start word, gram) for every indexed gram occurring in the texts."""
        # below _SMALL_CHARS, numpy's per-call overhead would dominate
        if sum(map(len, texts)) < self._SMALL_CHARS:
            for t, text in enumerate(texts):
                words, start = normalize_words(text), 0
                # only runs of benchmark words can hold a gram; "" is never one, so it ends the
                # last run
                for end, word in enumerate([*words, ""]):
                    if word in self._vocab:
                        continue
                    for m in self.lengths:
                        for i in range(start, end - m + 1):
                            if (gram := tuple(words[i : i + m])) in self._grams:
                                yield t, i, gram
                    start = end + 1
            return
        raw, starts, ends, word_hash = self._tokens(texts)
        if not self.lengths or len(word_hash) < self.lengths[-1]:
            return
        bounds = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8) == ord(_SEP))
        prefix = self._prefix(word_hash)
        shift = np.uint64(64 - self._bits)
        for m in self.lengths:
            if len(word_hash) < m:
                continue
            slot = self._window_hashes(word_hash, m, prefix) >> shift
            cand = np.flatnonzero(self._bitmap[slot >> np.uint64(3)] & _BIT[slot & np.uint64(7)])
            a, b = starts[cand], ends[cand + m - 1]
            for t, i, lo, hi in zip(
                np.searchsorted(bounds, a).tolist(),
                cand.tolist(),
                a.tolist(),
                b.tolist(),
                strict=True,
            ):
                # a window across texts keeps _SEP inside a word, so it is never a key
                gram = tuple(raw[lo:hi].decode().split())
                if gram in self._grams:
                    yield t, i, gram

    def contaminated(self, text: str) -> bool:
        """True when ``text`` shares any indexed gram; stops at the first confirmed hit."""
        return next(self._hits([text]), None) is not None

    def matches(self, text: str) -> list[Match]:
        """Every (benchmark, item, ngram) hit, deduplicated, ordered by benchmark name, item, first
        position."""
        return self.scan([text])[0]

    def scan(self, texts: Sequence[str]) -> list[list[Match]]:
        """``[self.matches(t) for t in texts]``, computed a chunk of texts per numpy pass."""
        out: list[list[Match]] = []
        lo = 0
        while lo < len(texts):
            hi, size = lo + 1, len(texts[lo])
            while hi < len(texts) and size + len(texts[hi]) <= self._CHUNK_CHARS:
                size += len(texts[hi])
                hi += 1
            first: dict[int, dict[tuple[str, ...], int]] = {}  # text -> gram -> first start word
            for t, pos, gram in self._hits(texts[lo:hi]):
                # hits come in position order per gram length
                first.setdefault(t, {}).setdefault(gram, pos)
            chunk: list[list[Match]] = [[] for _ in range(lo, hi)]
            for t, grams in first.items():
                found = sorted(
                    (b, item, pos, gram)
                    for gram, pos in grams.items()
                    for b, item in self._grams[gram]
                )
                chunk[t] = [Match(b, item, " ".join(gram)) for b, item, _, gram in found]
            out += chunk
            lo = hi
        return out
