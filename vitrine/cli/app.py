"""The ``vitrine`` command with every subcommand registered: the console script's entry point."""

import importlib

from vitrine.cli.base import main

# each module registers its subcommands when imported (in this order: the order of ``vitrine --help``)
COMMAND_MODULES = ("commands", "kafka", "eventscmd", "storecmd", "simulate", "rulescmd", "bench", "evalcmd",
                   "train", "graphcmd", "tune", "reliability", "settingscmd", "feedback", "makecat", "trustcmd")
for _module in COMMAND_MODULES:
    importlib.import_module(f"vitrine.cli.{_module}")

__all__ = ["main"]
