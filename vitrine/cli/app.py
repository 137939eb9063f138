"""The ``vitrine`` command with every subcommand registered: the console script's entry point."""

from vitrine.cli.base import main
from vitrine.cli import commands  # noqa: F401  (registers its commands)
from vitrine.cli import kafka  # noqa: F401  (registers its commands)
from vitrine.cli import eventscmd  # noqa: F401  (registers its commands)
from vitrine.cli import storecmd  # noqa: F401  (registers its commands)
from vitrine.cli import simulate  # noqa: F401  (registers its commands)
from vitrine.cli import rulescmd  # noqa: F401  (registers its commands)
from vitrine.cli import bench  # noqa: F401  (registers its commands)
from vitrine.cli import evalcmd  # noqa: F401  (registers its commands)
from vitrine.cli import train  # noqa: F401  (registers its commands)
from vitrine.cli import graphcmd  # noqa: F401  (registers its commands)
from vitrine.cli import tune  # noqa: F401  (registers its commands)
from vitrine.cli import reliability  # noqa: F401  (registers its commands)
from vitrine.cli import settingscmd  # noqa: F401  (registers its commands)
from vitrine.cli import feedback  # noqa: F401  (registers its commands)
from vitrine.cli import makecat, trustcmd  # noqa: F401  (register their commands)

__all__ = ["main"]
