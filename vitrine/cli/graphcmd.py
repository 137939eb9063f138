"""``vitrine graph``: the product knowledge graph's data (brand lexicon, mapping checks) and stats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from vitrine.cli.base import main, make_settings


@main.group()
def graph() -> None:
    """The product knowledge graph: learn the brand lexicon, check the data, inspect a data dir."""


@graph.command("learn-brands")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder with styles.csv (default: the bundled catalogue)")
@click.option("--catalog", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Any JSONL/CSV catalogue instead: prints the brands the graph learns from it")
@click.option("--graph-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Graph data folder holding brand_overrides.json; brands.json is written there")
@click.option("--min-count", type=int, default=2, show_default=True, help="Titles a brand needs to be learned")
def learn_brands_cmd(source: Path | None, catalog: Path | None, graph_dir: Path | None, min_count: int) -> None:
    """Learn the brand lexicon from the catalogue's titles (brand first, multi-word brands kept)."""
    from vitrine.index.vocabulary import learn_brands
    from vitrine.bundled import bundled_dir, read_styles

    settings = make_settings()
    if catalog is not None:
        _print_catalogue_brands(catalog, settings, min_count)
        return
    gdir = graph_dir or settings.index.graph_dir
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


def _print_catalogue_brands(catalog: Path, settings, min_count: int) -> None:
    """The brands a graph over ``catalog`` holds: the ``brand`` field where records have one, else
    what the titles say (the shipped lexicon, the words before a gender word, leading words)."""
    from collections import Counter

    from vitrine.index.graph import ProductGraph
    from vitrine.index.vocabulary import GraphData
    from vitrine.index.learned import learn_title_brands

    docs = _catalogue_docs(catalog)
    g = ProductGraph(GraphData.load(settings.index.graph_dir, settings.index.taxonomy_file))
    learned = learn_title_brands(g.data, docs, min_count=max(min_count, 2))
    g.upsert_many((i + 1, str(d.get("id") or i), d) for i, d in enumerate(docs))
    counts = Counter(f.brand for f in (g.facts(i + 1) for i in range(len(docs))) if f is not None and f.brand)
    from_field = sum(1 for d in docs if d.get("brand"))
    for name, n in counts.most_common():
        click.echo(f"{n:6d}  {name}{'  (learned from titles)' if name in learned else ''}")
    click.echo(f"{len(counts)} brands over {len(docs)} products ({from_field} with a brand field, "
               f"{len(learned)} brands learned from titles)")


@graph.command("check")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False), default=None)
def check(source: Path | None) -> None:
    """Check the graph data against the catalogue: every article type mapped to an existing
    taxonomy node and placed in an outfit; prints the mapping."""
    from vitrine.index.graph import ProductGraph
    from vitrine.index.vocabulary import GraphData, norm_key
    from vitrine.bundled import bundled_dir, read_styles

    settings = make_settings()
    data = GraphData.load(settings.index.graph_dir, settings.index.taxonomy_file)
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
@click.option("--mapping", is_flag=True, help="Also list each category's place on Google's taxonomy")
def stats(data_dir: Path, mapping: bool) -> None:
    """Graph size of a data dir's snapshot, and its category mapping (no models loaded)."""
    from vitrine.index.graph import ProductGraph
    from vitrine.index.vocabulary import GraphData

    settings = make_settings(data_dir=data_dir)
    manifest = data_dir / "index" / "manifest.json"
    m = json.loads(manifest.read_text()) if manifest.is_file() else {}
    name = next((f for f in ("graph.varr", "graph.json") if f in m.get("files", {})), "graph.varr")
    sha = m.get("files", {}).get(name)
    folder = data_dir / "index" / m["dir"] if m.get("dir") else data_dir / "index"  # the current snapshot version
    data = GraphData.load(settings.index.graph_dir, settings.index.taxonomy_file)
    fp = m.get("graph_fingerprint")
    if fp and fp != data.fingerprint:  # built with a mapper (the engine's): read it as it is
        data.fingerprint = fp
    g = ProductGraph.load(folder / name, data, sha)
    click.echo(json.dumps(g.stats(), indent=2))
    if mapping:
        for row in g.mapping():
            if row["products"]:
                click.echo(f"{row['products']:6d} {row['source']:9s} {row['confidence']:5.2f}  "
                           f"{' > '.join(row['path'])}  ->  {row['taxonomy_path'] or '(unmapped)'}")


def _catalogue_docs(catalog: Path | None) -> list[dict]:
    """Product documents of a JSONL/CSV catalogue, or of the bundled fashion catalogue."""
    if catalog is None:
        from vitrine.bundled import bundled_dir, read_styles
        from vitrine.ingest.fashion import to_record

        return [to_record(r, "") for r in read_styles(bundled_dir())]
    from vitrine.ingest.catalog import read_catalog

    return [p.product.document() for p in read_catalog(catalog) if p.product is not None]


def _leaf_paths(docs: list[dict]) -> list[tuple[str, ...]]:
    """One path per leaf category: the one most of its products carry (as the graph keys a
    category by its leaf name)."""
    from collections import Counter

    from vitrine.index.learned import category_path
    from vitrine.index.vocabulary import norm_key

    counts = Counter(tuple(category_path(d)) for d in docs if category_path(d))
    best: dict[str, tuple[str, ...]] = {}
    for path, _n in counts.most_common():
        best.setdefault(norm_key(path[-1]), path)
    return list(best.values())


def _mapper(settings, threshold: float | None):
    from vitrine.index.vocabulary import GraphData
    from vitrine.index.taxonomy_map import mapper_for
    from vitrine.search.engine import build_encoder

    data = GraphData.load(settings.index.graph_dir, settings.index.taxonomy_file)
    enc = build_encoder(settings)
    th = settings.index.taxonomy_map_threshold if threshold is None else threshold
    mapper = mapper_for(data.taxonomy, data.taxonomy_sha256, enc.text_features, enc.towers.key,
                        settings.index.taxonomy_vectors_file, th)
    return data, enc, mapper


@graph.command("embed-taxonomy")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Where to write (default: VITRINE_TAXONOMY_VECTORS_FILE)")
def embed_taxonomy(out: Path | None) -> None:
    """Embed every path of Google's taxonomy with the text tower (safetensors, float16): what the
    automatic category mapping compares a catalogue's categories with."""
    from vitrine.index.vocabulary import GraphData
    from vitrine.index.taxonomy_map import TaxonomyVectors
    from vitrine.search.engine import build_encoder

    settings = make_settings()
    data = GraphData.load(None, settings.index.taxonomy_file)
    enc = build_encoder(settings)
    tv = TaxonomyVectors.compute(data.taxonomy, lambda t: enc.text_features(t, progress=True), enc.towers.key)
    path = out or settings.index.taxonomy_vectors_file
    tv.save(path, data.taxonomy_sha256)
    click.echo(f"{len(tv.ids)} taxonomy paths embedded by {enc.towers.key} -> {path}")


@graph.command("map")
@click.option("--catalog", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="A JSONL/CSV catalogue (default: the bundled fashion catalogue)")
@click.option("--threshold", type=float, default=None, help="Confidence threshold (default: the setting)")
def map_cmd(catalog: Path | None, threshold: float | None) -> None:
    """Map a catalogue's leaf category paths onto Google's taxonomy (automatic mapping only, the
    reviewed category_map.csv left aside): node, confidence, runner-up."""
    settings = make_settings()
    data, _enc, mapper = _mapper(settings, threshold)
    paths = _leaf_paths(_catalogue_docs(catalog))
    for m in sorted(mapper.map_paths(paths), key=lambda m: -m.confidence):
        best = " > ".join(data.taxonomy.get(m.best_id, ())) if m.best_id is not None else "-"
        click.echo(f"{m.confidence:5.2f} {'   ' if m.taxonomy_id else 'NO '} {' > '.join(m.path)}  ->  {best}")
    click.echo(f"{len(paths)} category paths; threshold {mapper.threshold}")


@graph.command("map-report")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=Path("bench-results"),
              show_default=True)
@click.option("--threshold", type=float, default=None, help="The operating threshold (default: the setting)")
def map_report(out: Path, threshold: float | None) -> None:
    """Measure the automatic category mapping against reviewed ones: the bundled fashion
    catalogue's article types against category_map.csv, and data/home-electronics against its
    categories.csv. Writes taxonomy_map.md/.json/.png."""
    from importlib.util import find_spec

    from vitrine.cli.bench import BENCH_EXTRA

    if find_spec("vitrine_bench") is None or find_spec("matplotlib") is None:
        raise click.ClickException(f"the report needs the bench extra ({', '.join(BENCH_EXTRA)}): "
                                   "pip install 'vitrine[bench]'")
    from vitrine.index.taxonomy_map import mapping_report
    from vitrine.index.vocabulary import norm_key
    from vitrine_bench.common import Report

    settings = make_settings()
    data, enc, mapper = _mapper(settings, threshold)
    th = mapper.threshold
    rep = Report("taxonomy_map", out, "Automatic category mapping onto Google's product taxonomy")
    rep.text(
        f"Each catalogue leaf category path is mapped with the text tower ({enc.towers.key}): cosine of the "
        "path's and every taxonomy path's MiniLM vectors, plus 0.1 x word overlap; confidence = "
        "(score + margin - 0.6) / 0.5 clipped to [0, 1], margin = lead over the best node outside the best "
        f"node's lineage. Operating threshold {th}: below it a category stays unmapped. Accuracy = the "
        "automatic node is the reviewed node; near = the reviewed node, its parent or its child. "
        "Command: `vitrine graph map-report --out bench-results`. docs/graph.md.")
    sets = _reviewed_mappings(data, mapper)
    rep.data["threshold"] = th
    rep.data["sets"] = {}
    for name, (maps, ref) in sets.items():
        r = mapping_report(maps, ref, data.taxonomy, norm_key)
        at = next(c for c in r["curve"] if abs(c["threshold"] - th) < 1e-9) if any(
            abs(c["threshold"] - th) < 1e-9 for c in r["curve"]) else None
        rep.data["sets"][name] = {**r, "at_threshold": at}
        rep.table(r["curve"], ["threshold", "coverage", "mapped", "accuracy", "accuracy_near"],
                  f"{name}: accuracy and coverage per confidence threshold")
        rep.table(r["rows"], ["category", "confidence", "auto_path", "reviewed_path", "exact", "near"],
                  f"{name}: every category (best first)")

    rep.plot("taxonomy_map.png", lambda ax: _draw_map_report(ax, rep.data["sets"]))
    click.echo(f"-> {rep.write()}")


def _reviewed_mappings(data: Any, mapper: Any) -> dict[str, tuple[Any, dict[str, int]]]:
    """The automatic mapping of each catalogue with reviewed categories, and the reviewed one: the
    bundled fashion catalogue's article types (category_map.csv) and data/home-electronics."""
    import csv

    from vitrine.index.vocabulary import norm_key
    from vitrine.bundled import bundled_dir

    paths = _leaf_paths(_catalogue_docs(None))
    reviewed = {k: tid for k, (tid, _name) in data.category_map.items()}
    sets = {"fashion-small (89 article types) vs category_map.csv": (mapper.map_paths(paths), reviewed)}

    he = bundled_dir().parent / "home-electronics"  # the repo's catalogue from another domain
    if (he / "catalog.jsonl").is_file():
        docs = _catalogue_docs(he / "catalog.jsonl")
        hpaths = _leaf_paths(docs)
        with open(he / "categories.csv", encoding="utf-8") as f:
            ref = {norm_key(r["category_path"].split(" > ")[-1]): int(r["taxonomy_id"]) for r in csv.DictReader(f)}
        sets["home-electronics (16 shop categories) vs categories.csv"] = (mapper.map_paths(hpaths), ref)
    return sets


def _draw_map_report(ax: Any, sets: dict[str, Any]) -> None:
    for name, d in sets.items():
        xs = [c["coverage"] for c in d["curve"]]
        ax.plot(xs, [c["accuracy"] for c in d["curve"]], marker="o", label=f"{name.split(' ')[0]} exact")
        ax.plot(xs, [c["accuracy_near"] for c in d["curve"]], marker=".", ls="--",
                label=f"{name.split(' ')[0]} near")
    ax.set_xlabel("coverage (share of categories mapped)")
    ax.set_ylabel("accuracy of those mapped")
    ax.set_title("Automatic taxonomy mapping: thresholds 0.0 ... 0.9")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

