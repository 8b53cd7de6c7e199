from pager.cli.app import main

main()
