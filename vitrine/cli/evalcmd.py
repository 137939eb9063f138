"""``vitrine eval``: Recall@K / MRR / nDCG on qrels through the engine, and the built-in protocols."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from vitrine.cli.base import emit_json, main, make_settings, model_options, store_option

log = logging.getLogger("vitrine")

PROTOCOLS = ["kagl-t2i", "kagl-subcat", "photo-self", "qrels", "attr", "complements", "intent", "ablation",
             "domain-shift", "composed", "degraded", "sessions", "session-lookalikes", "zh"]


@main.command("eval")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
              help="Data dir to search (qrels and photo-self protocols)")
@click.option("--queries", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Queries JSONL: {qid, text?, image?, relevant: {id: grade}}")
@click.option("--protocol", type=click.Choice(PROTOCOLS), default=None,
              help="Built-in protocol on the bundled catalogue (default: qrels when --queries is given)")
@click.option("--k", "ks", default="1,5,10", show_default=True, help="Cut-offs, comma-separated")
@click.option("--split", default="test", show_default=True, help="Split whose products seed the queries")
@click.option("--json", "json_out", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the result (with a flat 'metrics' object) here")
@click.option("--fusion", type=click.Choice(["rrf", "weighted", "off"]), default=None,
              help="Hybrid ranking: reciprocal-rank or weighted fusion of vector, BM25 and graph; off = vectors only "
                   "(default from settings)")
@click.option("--signals", default=None, help="Signals fused with the vectors: bm25,graph | bm25 | graph | none")
@click.option("--gains", type=click.Choice(["linear", "exponential"]), default="linear", show_default=True,
              help="nDCG's gain for graded qrels: linear (a grade g earns g: WANDS exact 2 = 1, partial 1 = 0.5) "
                   "or exponential (2^g - 1); binary qrels score the same either way")
@click.option("--n", "n_queries", type=int, default=None,
              help="Queries for --protocol attr (default 500) or composed (400), anchors for --protocol complements "
                   "(default 200), photos for --protocol degraded (default: every photo of the split)")
@click.option("--intent/--no-intent", "use_intent", default=None,
              help="Query intent + slot filters in the searches (default from settings)")
@click.option("--adapters", default=None,
              help="--protocol ablation (default linear,mlp) or degraded (default: the served adapter and mlp): "
                   "adapters to compare, comma-separated (shipped names or folders; "
                   "NAME=FOLDER labels one; FOLDER@KEY=VALUE sets an inference option of those weights, e.g. "
                   "moe-dk=moe@dynamic_k=true@dynamic_threshold=0.7); the ConSE and text-tower baselines "
                   "are always in")
@click.option("--report", "report_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="--protocol ablation / degraded: write gate_ablation.* / degraded.* (.md/.json/.png) here "
                   "(domain-shift: domain-shift.md/...)")
@model_options
@store_option
def eval_cmd(data_dir: Path | None, queries: Path | None, protocol: str | None, ks: str, split: str,
             json_out: Path | None, fusion: str | None, signals: str | None, gains: str, n_queries: int | None,
             use_intent: bool | None, adapters: str | None, report_dir: Path | None, **model: Any) -> None:
    """Measure retrieval quality: Recall@K, MRR, nDCG (and the KAGL protocols)."""
    cutoffs = _cutoffs(ks)
    protocol = protocol or ("qrels" if queries else None)
    if protocol is None:
        raise click.UsageError("give --queries QRELS (with --data) or --protocol")
    if protocol == "domain-shift":  # leave each domain out, serve it as a new catalogue (docs/tuning.md)
        import tempfile

        from vitrine.cli.tune import domain_shift_command

        work = data_dir or Path(tempfile.mkdtemp(prefix="vitrine-domain-shift-"))
        result = domain_shift_command(make_settings(**model), work, n_queries or 200, retrain=True)
        emit_json(result, json_out)
        if report_dir:
            from vitrine.evals.domain_shift import write_report

            write_report(result, report_dir)
        return
    if protocol == "intent":  # the intent classifier on its held-out queries (no data dir needed)
        _intent_eval(json_out)
        return
    settings = make_settings(data_dir=data_dir, fusion=fusion, fusion_signals=signals, intent=use_intent, **model)
    if protocol in ("sessions", "session-lookalikes"):  # scripted sessions; look-alike cues (docs/sessions.md)
        from vitrine.cli.sessionscmd import sessions_eval

        sessions_eval(settings, data_dir, n_queries or 120, json_out, report_dir, lookalikes=protocol != "sessions")
        return
    if protocol == "ablation":  # every adapter kind on the same split (no data dir needed)
        _ablation(settings, _adapter_list(adapters or "linear,mlp"), split, n_queries or 500, json_out, report_dir)
        return
    if protocol in ("composed", "degraded"):  # over the bundled catalogue's features (no data dir needed)
        from vitrine.cli.evalextra import composed_or_degraded

        default = f"{settings.encoders.adapter},mlp" if settings.encoders.adapter != "mlp" else "mlp"
        composed_or_degraded(protocol, settings, split=split, n=n_queries, adapters=_adapter_list(adapters or default),
                             json_out=json_out, report_dir=report_dir)
        return
    if protocol == "zh":  # Chinese twins of English queries, side by side (vitrine/evals/chinese.py)
        if data_dir is None:
            raise click.UsageError("--protocol zh searches a data dir: give --data")
        emit_json(_chinese(settings, queries, cutoffs, split, n_queries), json_out)
        return
    if protocol in ("qrels", "photo-self", "attr", "complements"):
        if data_dir is None:
            raise click.UsageError(f"--protocol {protocol} searches a data dir: give --data")
        result = _data_dir_protocol(protocol, settings, queries, cutoffs, split, n_queries, gains)
    else:
        result = _tower_protocol(protocol, settings, split)
    result["adapter"] = settings.encoders.adapter
    if protocol in ("qrels", "attr"):
        result["fusion"] = {"method": settings.search.fusion, "signals": settings.search.fusion_signals}
    emit_json(result, json_out)


def _cutoffs(ks: str) -> list[int]:
    try:
        cutoffs = sorted({int(x) for x in ks.split(",") if x.strip()})
    except ValueError as e:
        raise click.BadParameter(f"--k must be integers like 1,5,10: {e}") from e
    if not cutoffs or cutoffs[0] < 1:
        raise click.BadParameter("--k needs positive cut-offs")
    return cutoffs


def _data_dir_protocol(protocol: str, settings: Any, queries: Path | None, cutoffs: list[int], split: str,
                       n_queries: int | None, gains: str = "linear") -> dict[str, Any]:
    """The protocols that search a data dir through the engine: qrels, complements, attr, photo-self."""
    from vitrine.evals import protocols as P
    from vitrine.evals.datasets import Catalog, EvalQuery, load_qrels
    from vitrine.search.engine import Engine

    engine = Engine.open(settings)
    if protocol == "qrels":
        if queries is None:
            raise click.UsageError("--protocol qrels needs --queries")
        return P.run_qrels(engine, load_qrels(queries), cutoffs, gain=gains)
    if protocol == "complements":
        from vitrine.evals.recommend_eval import complements_check

        catalog = Catalog.load()
        split_ids = [pid for pid, m in zip(catalog.ids, catalog.split_mask(split)) if m]
        result = complements_check(engine, split_ids, n=n_queries or 200, k=cutoffs[-1])
        result["split"] = split
        return result
    if protocol == "attr":
        qs = attribute_queries(settings, split, n_queries or 500)
        present = set(engine.records.ids())
        evq = [EvalQuery(qid=q["qid"], text=q["text"], image=None,
                         relevant={i: 1.0 for i in q["relevant"] if i in present}) for q in qs]
        result = P.run_qrels(engine, [q for q in evq if q.relevant], cutoffs)
        result["protocol"], result["split"] = "attr", split
        return result
    return P.photo_self(engine, Catalog.load(), split=split)


def _chinese(settings: Any, queries: Path | None, cutoffs: list[int], split: str, n: int | None) -> dict[str, Any]:
    """--protocol zh: a qrels file whose Chinese lines carry their ``english`` twin (--queries), or the
    attribute queries' Chinese twins and the hand-written fashion twins on the bundled catalogue."""
    from vitrine.bundled import bundled_dir, read_styles
    from vitrine.evals import chinese
    from vitrine.search.engine import Engine

    engine = Engine.open(settings)
    if queries is not None:
        return {"protocol": "zh", "queries_file": str(queries),
                **chinese.run_twins(engine, chinese.qrels_twins(queries), cutoffs)}
    present = set(engine.records.ids())

    def kept(qs: list[dict]) -> list[dict]:
        out = []
        for q in qs:
            rel = {i: 1 for i in q["relevant"] if i in present}
            if rel:
                out.append({**q, "relevant": rel})
        return out

    attr = kept(chinese.attribute_twins(attribute_queries(settings, split, n or 200)))
    hand = kept(chinese.hand_twins(read_styles(bundled_dir())))
    return {"protocol": "zh", "split": split, "catalogue": chinese.catalogue_language(engine),
            "attribute_twins": chinese.run_twins(engine, attr, cutoffs),
            "hand_twins": chinese.run_twins(engine, hand, cutoffs)}


def _tower_protocol(protocol: str, settings: Any, split: str) -> dict[str, Any]:
    """The KAGL protocols: the towers and the adapter on the bundled catalogue, no data dir."""
    from vitrine.evals import protocols as P
    from vitrine.evals.datasets import Catalog
    from vitrine.search.engine import build_encoder

    encoder = build_encoder(settings)
    catalog = Catalog.load()
    result = P.kagl_t2i(encoder, catalog, split=split) if protocol == "kagl-t2i" else P.kagl_subcat(encoder, catalog)
    result["model"] = encoder.model_key
    if hasattr(encoder.adapter, "routing_stats"):
        result["routing"] = P.routing_report(encoder, catalog, split=split)
    return result


def _adapter_list(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]


def attribute_queries(settings: Any, split: str, n: int, seed: int = 1) -> list[dict]:
    """Attribute queries seeded by ``split``'s products (:mod:`vitrine.evals.catalogue_queries`)."""
    from vitrine.evals import catalogue_queries

    return catalogue_queries.attribute_queries(settings.index.graph_dir, settings.index.taxonomy_file, split, n, seed)


@main.command("make-queries")
@click.option("--kind", type=click.Choice(["attr", "words"]), default="attr", show_default=True,
              help="attr: attributes named (\"puma women sports shoes\"); words: a brand and rare title words "
                   "(\"Nike Sahara\")")
@click.option("--split", type=click.Choice(["val", "test", "train"]), default="test", show_default=True,
              help="Split whose products seed the queries (tune on val, report on test)")
@click.option("--n", type=int, default=500, show_default=True, help="Number of queries")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), required=True, help="Qrels JSONL to write")
def make_queries(kind: str, split: str, n: int, seed: int, out: Path) -> None:
    """Write a qrels file from the bundled catalogue for `vitrine eval --queries`: attribute queries
    (relevant = every product matching all the attributes named) or exact-word queries (relevant =
    every product whose title holds all the words)."""
    from vitrine.evals.attribute_queries import write_qrels

    if kind == "attr":
        qs = attribute_queries(make_settings(), split, n, seed)
    else:
        qs = title_word_queries(make_settings(), split, n, seed)
    write_qrels(qs, out)
    click.echo(f"wrote {len(qs)} {split} {kind} queries to {out}")


def title_word_queries(settings: Any, split: str, n: int, seed: int = 1) -> list[dict]:
    """Exact-word queries seeded by ``split``'s products (:mod:`vitrine.evals.catalogue_queries`)."""
    from vitrine.evals import catalogue_queries

    return catalogue_queries.title_word_queries(settings.index.graph_dir, settings.index.taxonomy_file, split, n, seed)


def _ablation(settings: Any, adapters: list[str], split: str, n_attr: int, json_out: Path | None,
              report_dir: Path | None) -> None:
    """``--protocol ablation``: the ConSE and text-tower baselines and each adapter, one table."""
    from vitrine.errors import VitrineError
    from vitrine.evals.ablation import load_embedders, run_ablation, write_report
    from vitrine.evals.datasets import Catalog
    from vitrine.search.engine import build_encoder

    encoder = build_encoder(settings)
    try:
        embedders = load_embedders(encoder, adapters)
    except VitrineError as e:
        raise click.BadParameter(str(e), param_hint="--adapters") from e
    result = run_ablation(encoder, Catalog.load(), embedders, split=split, n_attr=n_attr)
    emit_json(result, json_out)
    if report_dir:
        for p in write_report(result, report_dir):
            click.echo(f"wrote {p}", err=True)


def _intent_eval(json_out: Path | None) -> None:
    """``--protocol intent``: accuracy, macro-F1 and slot exact-match of the shipped intent
    classifier on its held-out queries (held-out templates and brand/type vocabulary)."""
    from vitrine.training.intent import evaluate_heldout

    settings = make_settings()
    result = evaluate_heldout(settings.intent.intent_model, cache_dir=settings.storage.cache_dir / "intent",
                              min_confidence=settings.intent.intent_min_confidence)
    result["metrics"] = {"accuracy": result["accuracy"], "macro_f1": result["macro_f1"],
                         "slot_exact_match": result["slot_exact_match"],
                         "heldout_titles_search_rate": result["heldout_titles"]["search_rate"],
                         "heldout_taxonomy_leaves_search_rate": result["heldout_taxonomy_leaves"]["search_rate"],
                         "deployed_rule_accuracy": result["deployed_rule"]["accuracy"]}
    emit_json(result, json_out)
    click.echo(f"intent held-out: accuracy {result['accuracy']:.4f}  macro-F1 {result['macro_f1']:.4f}  "
               f"slot exact-match {result['slot_exact_match']:.4f}  (n={result['n']}); held-out catalogue "
               f"titles sent to search {result['heldout_titles']['search_rate']:.4f} "
               f"(n={result['heldout_titles']['n']}); held-out taxonomy leaves sent to search "
               f"{result['heldout_taxonomy_leaves']['search_rate']:.4f} (n={result['heldout_taxonomy_leaves']['n']}); "
               f"deployed rule accuracy {result['deployed_rule']['accuracy']:.4f}",
               err=True)
