"""``vitrine eval --protocol composed | degraded``: the aligner's photo + words and poor-photo protocols."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def composed_or_degraded(protocol: str, settings: Any, *, split: str, n: int | None, adapters: list[str],
                         json_out: Path | None, report_dir: Path | None) -> None:
    from vitrine.cli.base import emit_json
    from vitrine.errors import VitrineError
    from vitrine.evals.datasets import Catalog
    from vitrine.search.engine import build_encoder

    encoder = build_encoder(settings)
    catalog = Catalog.load()
    if protocol == "composed":
        from vitrine.evals.composed import composed_eval

        result = composed_eval(encoder, catalog, split=split, n=n or 400,
                               served_weight=settings.search.query_image_weight)
        result["model"], result["adapter"] = encoder.model_key, settings.encoders.adapter
        paths: list[Path] = []
    else:
        from vitrine.evals.degraded import degraded_eval, write_report

        try:
            result = degraded_eval(encoder, catalog, adapters, split=split, limit=n)
        except VitrineError as e:
            raise click.BadParameter(str(e), param_hint="--adapters") from e
        paths = write_report(result, report_dir) if report_dir else []
    emit_json(result, json_out)
    for p in paths:
        click.echo(f"wrote {p}", err=True)
