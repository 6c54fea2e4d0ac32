"""The `parley` command line, one module per command group; ``main`` in main.py.

Nothing outside this package imports it (the import contract in pyproject.toml): the
running gateway, its storage and its upgrades of an earlier home live beside it, and
the commands here only parse, call them and print. Importing this package imports no
command, so ``gateway.cli.locomo`` loads without the rest.
"""
