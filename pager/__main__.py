"""`python -m pager`: the command line, as the `pager` command runs it."""

from pager.cli.app import main

main()
