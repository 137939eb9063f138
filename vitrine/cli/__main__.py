"""``python -m vitrine.cli`` runs the ``vitrine`` command."""

from vitrine.cli.app import main

if __name__ == "__main__":
    main()
