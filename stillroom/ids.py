"""Stable identities: prompt ids from normalised text, shards from prompt ids (never from row
order)."""

from __future__ import annotations

import hashlib
import re
import unicodedata

_WS = re.compile(r"\s+")


def normalize_prompt(text: str) -> str:
    """Unicode NFKC, whitespace folded and trimmed; case and punctuation kept (they can change
    meaning)."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def prompt_id(text: str, source: str) -> str:
    """16 hex digits of sha256 over the source name and the normalised prompt."""
    digest = hashlib.sha256(f"{source}\x1f{normalize_prompt(text)}".encode()).hexdigest()
    return digest[:16]


def bucket(key: str, modulus: int) -> int:
    """A uniform bucket in [0, modulus) from a hex id (or any string, hashed first)."""
    if modulus < 1:
        raise ValueError(f"modulus must be >= 1, got {modulus}")
    try:
        value = int(key, 16)
    except ValueError:
        value = int(hashlib.sha256(key.encode()).hexdigest()[:16], 16)
    return value % modulus


def shard_of(pid: str, n_shards: int) -> int:
    return bucket(pid, n_shards)
