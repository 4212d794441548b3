"""An environment module that imports in the server but not in a worker process
(as one needing a device only the server's process has): worker mode cannot start."""

from __future__ import annotations

import sys

from tests.support.reliability_environments import ProbeEnv
from tests.support.worker_environments import WORKER_PROGRAMS

if sys.argv[0].endswith(WORKER_PROGRAMS):  # `python -m ors_grpc._runtime.workers.worker` (or `.template`)
    raise RuntimeError("no simulator licence in this process")


class WorkerShyEnv(ProbeEnv):
    """ProbeEnv, from a module workers cannot import."""
