"""The garbage collector's settings of a process that serves: the server, and each worker.

Once a process serves, what is alive (modules, classes, the servers, the
environments' classes) lives as long as it: `gc.freeze` takes it out of the
collector's sight. And full collections come `FULL_COLLECTION_EVERY`
middle-generation collections apart, not Python's 10: each walks every
open episode's objects while the event loop waits. Young garbage is
collected as often as before. The measurement is in docs/benchmarks.md ("A
crowd with think time").
"""

import gc

#: A full collection every this many collections of the middle generation (Python's default: 10). With 4,096
#: open episodes on two busy cores a full collection held the server's loop 0.5 to 2 s, every few seconds.
FULL_COLLECTION_EVERY = 100


def settle() -> None:
    """Freezes what is alive now and spaces full collections out; call once the process serves."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
