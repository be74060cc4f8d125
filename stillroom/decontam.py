"""``stillroom.decontam.NgramIndex`` at the path it was first published under (it lives in
stillroom/data/decontam.py; the decontam stage in stillroom/stages/decontam.py)."""

from .data.decontam import Match, NgramIndex, normalize_words

__all__ = ["Match", "NgramIndex", "normalize_words"]
