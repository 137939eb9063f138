"""Data shipped inside the package, read through one accessor (``importlib.resources``).

A leaf module: it imports nothing of Vitrine's, so every layer may use it.

- ``graph/``: the knowledge graph's reviewed data (category map, complements, colours,
  vocabulary, brand lexicon); see ``graph/README.md``.
- ``taxonomy/``: Google's product taxonomy, the graph's category backbone.
- ``demo/``: a small catalogue with photos (``styles.csv``, ``splits.csv``, ``images/``) that
  ``vitrine demo`` builds from; see ``demo/README.md``.

Everything the product reads at run time is here, in the other packages' shipped weights and
configs, or in the data dir: nothing reads a path into a source checkout.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

TAXONOMY_FILE = "google-product-taxonomy.en-US.txt"


def resource_path(*parts: str) -> Path:
    """The file or folder ``parts`` inside ``vitrine/resources`` as a filesystem path.

    Vitrine is installed as files (a wheel unpacks; never a zip import), so the resource is a
    real path that code can open, list and hash.
    """
    return Path(str(files(__name__).joinpath(*parts)))


def graph_dir() -> Path:
    """The shipped knowledge-graph data folder (the default of ``Settings.graph_dir``)."""
    return resource_path("graph")


def taxonomy_file() -> Path:
    """Google's product taxonomy file (the default of ``Settings.taxonomy_file``)."""
    return resource_path("taxonomy", TAXONOMY_FILE)


def demo_dir() -> Path:
    """The shipped demo catalogue: ``styles.csv``, ``splits.csv`` and ``images/<id>.jpg``."""
    return resource_path("demo")
