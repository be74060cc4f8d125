"""The documentation holds together: every relative link of README.md and docs/*.md names a file of
the repository, and docs/config.md is what scripts/config_reference.py writes from the config."""

from __future__ import annotations

import re

from stillroom.config import schema

from .conftest import REPO
from .readme import documents, script_module

# [text](target): a target without a scheme, outside code spans and fenced blocks
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """``text`` without fenced blocks and code spans, where brackets are code, not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`+[^`]*`+", "", text)


def relative_links(text: str) -> list[str]:
    """The link targets of ``text`` that name a path (no URL, no bare #anchor), anchors cut."""
    targets = (t for t in LINK.findall(prose(text)) if not re.match(r"[a-z]+:|#", t))
    return [t.split("#", 1)[0] for t in targets]


def test_relative_links_are_found_outside_code():
    text = (
        "see [a](docs/a.md#x), [b](https://x.org), [c](#top)\n`[d](no.md)`\n```\n[e](no.md)\n```\n"
    )
    assert relative_links(text) == ["docs/a.md"]


def test_every_relative_link_of_the_documentation_names_a_file():
    broken = [
        f"{path.relative_to(REPO)}: {target}"
        for path in documents()
        for target in relative_links(path.read_text())
        if not (path.parent / target).exists()
    ]
    assert not broken, f"links to no file: {broken}"


def test_the_readme_links_every_page_under_docs():
    linked = {(REPO / t).resolve() for t in relative_links((REPO / "README.md").read_text())}
    unlinked = [p.name for p in documents()[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs/ pages the README does not point to: {unlinked}"


def test_the_config_reference_is_the_generators_output():
    reference = script_module("config_reference")
    written = reference.render(schema())
    assert reference.OUT.read_text() == written, (
        "docs/config.md is stale: run python scripts/config_reference.py"
    )
    # every key of every config class has its row
    for name, model in schema()["$defs"].items():
        section = written.split(f'<a id="{name.lower()}"></a>', 1)[1].split("<a id=", 1)[0]
        for key in model.get("properties", {}):
            assert f"| `{key}` |" in section, (name, key)


def test_every_config_key_has_a_description():
    # the reference's meaning column is the description: a key without one is a blank row
    top = schema()
    models = {"Experiment": top, **top["$defs"]}
    bare = [
        f"{name}.{key}"
        for name, model in models.items()
        for key, prop in model.get("properties", {}).items()
        if not prop.get("description", "").strip()
    ]
    assert not bare, f"config keys without a Field(description=...): {bare}"


def test_the_documented_figures_are_the_scripts():
    # the bill, memory and size figures quoted in docs/ are what the code gives today (seconds)
    figures = script_module("doc_figures")
    stale = [page for page, text in figures.rendered().items() if (REPO / page).read_text() != text]
    assert not stale, f"{stale}: stale figures, run python scripts/doc_figures.py"
