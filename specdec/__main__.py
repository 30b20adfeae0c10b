from specdec.cli import main

main()
