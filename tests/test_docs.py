"""The front door stays true: docs/configuration.md's settings table is the generator's output, every
setting is described, relative links in the docs resolve, every report is in the measurements
index, and docstrings cite the design page that exists."""

from __future__ import annotations

import re

from vitrine.cli.settingscmd import BEGIN, END, replace_block, settings_markdown
from vitrine.settings import SECTIONS

from conftest import REPO

DOCS = [REPO / "README.md", REPO / "bench-results" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_settings_table_is_generated_from_settings() -> None:
    readme = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = readme[readme.index(BEGIN) + len(BEGIN):readme.index(END)].strip("\n")
    assert block == settings_markdown().strip("\n"), \
        "docs/configuration.md's settings table is stale: run `vitrine settings --update docs/configuration.md`"
    assert replace_block(readme, settings_markdown()) == readme


def test_every_setting_has_a_description_and_a_row() -> None:
    table = settings_markdown()
    for section, cls in SECTIONS.items():
        assert f"(`settings.{section}`)" in table
        for name, field in cls.model_fields.items():
            assert field.description, f"settings.{section}.{name} has no description= (docs/configuration.md's table shows it)"
            assert f"| `{name.upper()}` |" in table


def test_relative_links_in_the_docs_resolve() -> None:
    missing = []
    for doc in DOCS:
        for target in _LINK.findall(doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                missing.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not missing, missing


def test_measurements_index_lists_every_report() -> None:
    index = (REPO / "bench-results" / "README.md").read_text(encoding="utf-8")
    reports = sorted(p.relative_to(REPO / "bench-results").as_posix()
                     for p in (REPO / "bench-results").rglob("*.md") if p.name != "README.md")
    unlisted = [r for r in reports if f"]({r})" not in index]
    assert not unlisted, f"bench-results/README.md does not list {unlisted}"


def test_docstrings_cite_the_design_page_in_the_repo() -> None:
    assert (REPO / "docs" / "design.md").is_file()
    stale = [str(p.relative_to(REPO)) for d in ("vitrine", "vitrine_bench") for p in (REPO / d).rglob("*.py")
             if re.search(r"(?<!docs/)DESIGN\.md", p.read_text(encoding="utf-8"))]
    assert not stale, f"cite docs/design.md, not DESIGN.md: {stale}"
