"""`vitrine simulate`: simulated shoppers over judged queries, through a running API
(vitrine/evals/simulate.py), with the learning curve of `vitrine tune`'s log learning."""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import click

from vitrine.cli.base import main, make_settings

log = logging.getLogger("vitrine")


def _rounds(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as e:
        raise click.BadParameter(f"--rounds takes session counts like 0,5,10,20: {e}") from e
    if not out or out[0] < 0:
        raise click.BadParameter("--rounds takes non-negative session counts")
    return out


@main.command("simulate")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="The running API")
@click.option("--key", envvar="VITRINE_API_KEY", default=None, help="X-API-Key for POST /v1/events (write or events key)")
@click.option("--queries", "queries_file", type=click.Path(path_type=Path, exists=True, dir_okay=False), required=True,
              help="Judged queries (the JSONL of `vitrine eval --queries`, e.g. from `vitrine make-queries`)")
@click.option("--head", type=int, default=20, show_default=True, help="Queries shoppers search (the logged ones)")
@click.option("--unlogged", type=int, default=100, show_default=True,
              help="Other queries, never searched by shoppers: measured only (must not drop)")
@click.option("--rounds", default="0,5,10,20,40,60", show_default=True,
              help="Sessions per head query after which to learn and measure")
@click.option("--learn-data", "learn_data", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="The server's data dir: after each round, learn from its log (as `vitrine tune --logs-only` does; "
                   "the server picks the result up within a second). Without it: log only")
@click.option("--data", "data_dir", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
              help="Serve this data dir's API in this process instead of calling --url (the same routes, event "
                   "intake and learning; learns from its log after each round). It writes there: give a copy")
@click.option("--serve-unjudged", is_flag=True,
              help="Serve the whole log's learned table after each round even where the later-slice test would not "
                   "keep it: measures what learning could do, not how Vitrine serves (it keeps only what wins)")
@click.option("--eta", type=float, default=1.0, show_default=True, help="Examination falls as (1/(rank+1))**eta")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--report", "report_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Write learning-loop.md/.json/.png here")
def simulate_cmd(url: str, key: str | None, queries_file: Path, head: int, unlogged: int, rounds: str,
                 learn_data: Path | None, data_dir: Path | None, serve_unjudged: bool, eta: float, seed: int,
                 report_dir: Path | None) -> None:
    """Simulated shoppers search, click, add to cart and buy through the API; measures nDCG@10 of
    the searched (head) queries and of never-searched ones after each round of learning."""
    from vitrine.evals import simulate as sim

    rows = [json.loads(line) for line in queries_file.read_text().splitlines() if line.strip()]
    qs = sim.judged_queries(rows)
    random.Random(seed).shuffle(qs)
    head_q, other_q = qs[:head], qs[head:head + unlogged]
    if not head_q:
        raise click.UsageError(f"{queries_file} holds no text query with a relevant product")
    plan = _rounds(rounds)
    engine, key = _open_engine(learn_data, data_dir, key)
    shopper = sim.Shopper(eta=eta)
    curve: list[dict[str, Any]] = []
    done = 0
    try:
        with _client(url, engine if data_dir is not None else None) as http:
            for n in plan:
                if n > done:
                    got = sim.simulate(http, head_q, n - done, key=key, shopper=shopper, seed=seed + n,
                                       first_user=done * len(head_q))
                    done = n
                    click.echo(f"{n} sessions per head query: {got.searches} searches, {got.clicks} clicks, "
                               f"{got.purchases} purchases", err=True)
                learned: dict[str, Any] = {}
                if engine is not None and n > 0:
                    from vitrine.evals.log_tuning import tune_from_logs

                    res = tune_from_logs(engine, seed=seed)
                    learned = {"outcome": res.report["outcome"], "judge": res.report.get("judge", {})}
                    if serve_unjudged and res.table is None:
                        _serve_whole_log(engine)
                        learned["outcome"] += "; served anyway (--serve-unjudged)"
                    time.sleep(1.5)  # the server re-reads learned.json at most once a second
                h, o = sim.evaluate(http, head_q), sim.evaluate(http, other_q)
                point = {"sessions": n, "head_nDCG@10": round(sim.mean(h), 4),
                         "unlogged_nDCG@10": round(sim.mean(o), 4), "learned": learned,
                         "per_query": {k: round(v, 4) for k, v in {**h, **o}.items()}}
                curve.append(point)
                click.echo(f"  head nDCG@10 {point['head_nDCG@10']:.4f}, never searched "
                           f"{point['unlogged_nDCG@10']:.4f}  {learned.get('outcome', '')}", err=True)
    finally:
        if engine is not None:
            engine.close()
    result = {"url": url if data_dir is None else f"in process: {data_dir}", "queries": str(queries_file),
              "serve_unjudged": serve_unjudged,
              "head": len(head_q), "unlogged": len(other_q),
              "head_queries": [q.text for q in head_q], "unlogged_queries": [q.text for q in other_q],
              "shopper": shopper.__dict__, "seed": seed, "curve": curve}
    click.echo(json.dumps(result, indent=2))
    if report_dir is not None:
        write_report(result, report_dir)


def _open_engine(learn_data: Path | None, data_dir: Path | None, key: str | None) -> tuple[Any, str | None]:
    """The engine to learn with (and, with ``data_dir``, to serve in process), and the events key."""
    if learn_data is None and data_dir is None:
        return None, key
    from vitrine.search.engine import Engine

    over: dict[str, Any] = {"data_dir": data_dir or learn_data, "learn_interval_s": 0}
    if data_dir is not None:  # served here: events need a key, this run's own unless one is given
        key = key or f"sim-{random.Random().getrandbits(64):016x}"
        over["events_key"] = key
    return Engine.open(make_settings(**over)), key


def _serve_whole_log(engine: Any) -> None:
    """Write the whole log's learned table as the served one, judged or not (--serve-unjudged)."""
    from vitrine.feedback.intake import save_learned

    got = engine.learn_from_log(save=False)
    if got.full is not None:
        save_learned(engine.data_dir, got.full)


def _client(url: str, engine: Any) -> Any:
    """An HTTP client of the API at ``url``, or of ``engine``'s API served in this process (the
    same routes and intake, through FastAPI's test client)."""
    if engine is None:
        import httpx

        return httpx.Client(base_url=url, timeout=60.0)
    from fastapi.testclient import TestClient

    from vitrine.web.app import create_app

    return TestClient(create_app(engine=engine))


def write_report(result: dict[str, Any], out: Path) -> None:
    """learning-loop.md/.json/.png: nDCG@10 against sessions per head query."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning-loop.json").write_text(json.dumps(result, indent=2))
    lines = ["# Learning from shoppers: simulated sessions through the API", "",
             f"{result['head']} head queries searched by simulated shoppers, {result['unlogged']} never searched "
             f"(from `{result['queries']}`); shopper model {result['shopper']}; seed {result['seed']}.", "",
             "Simulated shoppers over judged queries, not real ones: these figures show the loop working end to "
             "end, not what real shoppers would gain.", "",
             "| sessions per head query | head nDCG@10 | never-searched nDCG@10 | learning |", "|---|---|---|---|"]
    for p in result["curve"]:
        lines.append(f"| {p['sessions']} | {p['head_nDCG@10']:.4f} | {p['unlogged_nDCG@10']:.4f} | "
                     f"{p['learned'].get('outcome', '')} |")
    (out / "learning-loop.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        xs = [p["sessions"] for p in result["curve"]]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, [p["head_nDCG@10"] for p in result["curve"]], "o-", label="searched (head) queries")
        ax.plot(xs, [p["unlogged_nDCG@10"] for p in result["curve"]], "s--", label="never-searched queries")
        ax.set_xlabel("simulated sessions per head query")
        ax.set_ylabel("nDCG@10")
        ax.set_title("Learning from (simulated) shoppers")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "learning-loop.png", dpi=100)
        plt.close(fig)
    except ImportError:  # pragma: no cover - matplotlib comes with the bench extra
        log.info("matplotlib missing: no plot")
