"""A serving process's garbage-collector settings (ors_grpc/_runtime/garbage_collection.py).

Run in a fresh interpreter: the settings are process-wide, and this test
process's own must stay Python's.
"""

import subprocess
import sys

from ors_grpc._runtime.garbage_collection import FULL_COLLECTION_EVERY

PROBE = """
import gc
from ors_grpc._runtime import garbage_collection
before = gc.get_threshold()
garbage_collection.settle()
after = gc.get_threshold()
print(before[0] == after[0], before[1] == after[1], after[2], gc.get_freeze_count() > 0)
"""


def test_settle_freezes_what_is_alive_and_spaces_full_collections_out_leaving_young_ones_alone():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", str(FULL_COLLECTION_EVERY), "True"], done.stdout
    assert FULL_COLLECTION_EVERY > 10  # Python's default: the point is fewer full collections
