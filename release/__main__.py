"""``python -m release``: the command line (as the ``release`` script)."""

from release.cli import main

main()
