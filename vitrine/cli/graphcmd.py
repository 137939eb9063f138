"""``vitrine graph``: the product knowledge graph's data (brand lexicon, mapping checks) and stats."""

from __future__ import annotations

import json
from pathlib import Path

import click

from vitrine.cli import main, make_settings


@main.group()
def graph() -> None:
    """The product knowledge graph: learn the brand lexicon, check the data, inspect a data dir."""


@graph.command("learn-brands")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder with styles.csv (default: the bundled catalogue)")
@click.option("--graph-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Graph data folder holding brand_overrides.json; brands.json is written there")
@click.option("--min-count", type=int, default=2, show_default=True, help="Titles a brand needs to be learned")
def learn_brands_cmd(source: Path | None, graph_dir: Path | None, min_count: int) -> None:
    """Learn the brand lexicon from the catalogue's titles (brand first, multi-word brands kept)."""
    from vitrine.index.graph import learn_brands
    from vitrine.ingest.fashion import bundled_dir, read_styles

    settings = make_settings()
    gdir = graph_dir or settings.graph_dir
    source = source or bundled_dir()
    rows = read_styles(source)
    ov_path = gdir / "brand_overrides.json"
    overrides = json.loads(ov_path.read_text()) if ov_path.is_file() else {}
    brands = learn_brands([r["productDisplayName"] for r in rows], overrides, min_count=min_count)
    out = {
        "about": "Brand lexicon learned from the catalogue's titles by `vitrine graph learn-brands` "
                 f"(styles.csv, {len(rows)} titles, min count {min_count}) with brand_overrides.json applied. "
                 "name = the most common spelling; count = titles; keys = normalised prefixes (case, spaces and "
                 "punctuation ignored) that mean this brand; forms = spellings seen. Regenerate, do not hand-edit.",
        "brands": brands,
    }
    path = gdir / "brands.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    click.echo(f"{len(brands)} brands from {len(rows)} titles -> {path}")


@graph.command("check")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False), default=None)
def check(source: Path | None) -> None:
    """Check the graph data against the catalogue: every article type mapped to an existing
    taxonomy node and placed in an outfit; prints the mapping."""
    from vitrine.index.graph import GraphData, ProductGraph, norm_key
    from vitrine.ingest.fashion import bundled_dir, read_styles

    settings = make_settings()
    data = GraphData.load(settings.graph_dir, settings.taxonomy_file)
    rows = read_styles(source or bundled_dir())
    types = sorted({r["articleType"] for r in rows})
    in_outfit = {norm_key(c) for o in data.outfits for s in o.slots for c in s}
    g = ProductGraph(data)
    problems = []
    for t in types:
        m = data.category_map.get(norm_key(t))
        if m is None:
            problems.append(f"{t}: not in category_map.csv")
            continue
        path = " > ".join(data.taxonomy.get(m[0], ("?",)))
        comp = sorted(g.complements_of(t))
        click.echo(f"{t:24s} -> {m[0]:>6} {path}  | complements: {len(comp)}")
        if norm_key(t) not in in_outfit:
            problems.append(f"{t}: in no outfit of complements.json")
    for p in problems:
        click.echo(f"problem: {p}", err=True)
    click.echo(f"{len(types)} article types, {len(problems)} problems; graph backbone {g.stats()}")
    if problems:
        raise SystemExit(1)


@graph.command("stats")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True)
def stats(data_dir: Path) -> None:
    """Graph size of a data dir's snapshot (no models loaded)."""
    from vitrine.index.graph import GraphData, ProductGraph

    settings = make_settings(data_dir=data_dir)
    manifest = data_dir / "index" / "manifest.json"
    m = json.loads(manifest.read_text()) if manifest.is_file() else {}
    sha = m.get("files", {}).get("graph.json")
    folder = data_dir / "index" / m["dir"] if m.get("dir") else data_dir / "index"  # the current snapshot version
    g = ProductGraph.load(folder / "graph.json", GraphData.load(settings.graph_dir, settings.taxonomy_file), sha)
    click.echo(json.dumps(g.stats(), indent=2))
