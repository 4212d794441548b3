"""`python -m ors_grpc` runs the `ors-grpc` command."""

from .cli import main

main()
