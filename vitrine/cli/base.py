"""What every ``vitrine`` command shares: the root group, logging, settings and the common options."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

# OpenMP worker threads that spin-wait between parallel regions turn a 10 ms MiniLM forward into
# hundreds of ms as soon as another process wants the same cores (measured on 2 shared cores:
# bench-results/fastpath.md). Passive waiting costs next to nothing on an idle machine. It must
# be set before torch or FAISS load their OpenMP runtime; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from vitrine.errors import InvalidInput, NotFound, VitrineError

log = logging.getLogger("vitrine")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    # Third-party chatter that says nothing to a Vitrine user.
    for noisy in ("httpx", "urllib3", "transformers", "timm", "kafka", "root"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    logging.getLogger().addFilter(_DropOpenClipNoise())


class _DropOpenClipNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (record.name == "root" and ("CLIP weights" in msg or "initialized" in msg
                                                or "pretrained weights" in msg))


def make_settings(**overrides: Any):  # Settings, imported lazily
    from vitrine.settings import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


class VitrineGroup(click.Group):
    """Turns domain errors into one clear line and exit code 2 instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (InvalidInput, NotFound) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except VitrineError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group(cls=VitrineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-level", default="INFO", show_default=True, help="DEBUG, INFO, WARNING, ERROR")
@click.version_option(package_name="vitrine")
def main(log_level: str) -> None:
    """Vitrine: multimodal semantic search for e-commerce catalogues."""
    setup_logging(log_level)


def data_option(f):
    return click.option("--data", "data_dir", type=click.Path(path_type=Path), required=True,
                        help="Data dir (records, photos, index)")(f)


def store_option(f):
    return click.option("--store", default=None, metavar="URL",
                         help="Shared record store postgresql://user:pw@host:port/db (default: SQLite in --data; "
                              "env VITRINE_STORE). --data then holds only rebuildable index snapshots and caches")(f)


def model_options(f):
    f = click.option("--adapter", default=None, help="Adapter name or folder (default from settings)")(f)
    f = click.option("--model", default=None, help="Tower config or open_clip architecture")(f)
    f = click.option("--pretrained", default=None, help="Local CLIP weights file for --model")(f)
    f = click.option("--index-factory", default=None, help="FAISS factory: Flat, HNSW32, IVF{n},Flat ...")(f)
    return f

def emit_json(result: Any, json_out: Path | None) -> None:
    """Print an eval's result as JSON and, with ``--json``, write the same text to that file."""
    text = json.dumps(result, indent=2, ensure_ascii=False)
    click.echo(text)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text + "\n")
