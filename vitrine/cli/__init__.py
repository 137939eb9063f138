"""The ``vitrine`` command: the one composition root that may reach every layer.

``vitrine.cli.base`` holds the root group and the shared options, each ``*cmd``/topic module its
commands, and ``vitrine.cli.app`` puts them together (the console script's entry point)."""
