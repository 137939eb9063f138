"""matplotlib for the eval reports' plots: an optional dependency (``vitrine[bench]``)."""

from __future__ import annotations

from types import ModuleType

from vitrine.errors import MissingExtra


def pyplot(what: str) -> ModuleType:
    """``matplotlib.pyplot`` on the headless Agg backend, or a clear :class:`MissingExtra` naming ``what``."""
    try:
        import matplotlib  # optional, only when a report is drawn

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingExtra(f"{what} needs matplotlib: pip install 'vitrine[bench]'") from e
    return plt
