"""`python -m ors_grpc` runs the `ors-grpc` command."""

from ors_grpc.cli import main

main()
