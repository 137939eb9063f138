"""The ``vitrine`` command with every subcommand registered: the console script's entry point."""

from vitrine.cli.base import main
from vitrine.cli import (commands, kafka, eventscmd, storecmd, simulate, rulescmd, bench, evalcmd, train, graphcmd,
                         tune, reliability, settingscmd, feedback, makecat, trustcmd)

# each module registers its subcommands when imported, in this order (the order of ``vitrine --help``)
COMMAND_MODULES = (commands, kafka, eventscmd, storecmd, simulate, rulescmd, bench, evalcmd, train, graphcmd, tune,
                   reliability, settingscmd, feedback, makecat, trustcmd)

__all__ = ["main", "COMMAND_MODULES"]
