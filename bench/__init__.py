"""Side-by-side benchmark: the reference ors-sdk server, our HTTP bridge, our gRPC door.

Run it with ``python -m bench`` (see ``docs/benchmarks.md``).
"""
