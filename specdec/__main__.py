from specdec.entrypoints.cli import main

main()
