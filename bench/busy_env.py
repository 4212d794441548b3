"""``bench.env:BenchEnv`` whose ``step`` also burns CPU: the scale-out benchmark's CPU-bound variant.

Real environments do work in their tools, and one Python process does it on
one core; this is what more backends are for. ``ORS_BENCH_STEP_CPU_MS`` (set by
``python -m bench --scaleout --scaleout-step-ms N``) is the CPU time each
``step`` spends. Same class name, so the environment is still ``benchenv`` and
the load generator runs unchanged.
"""

import os
import time

from bench import env
from ors_grpc import ToolOutput, tool

STEP_CPU_S = float(os.environ.get("ORS_BENCH_STEP_CPU_MS", "0")) / 1000


def burn_cpu(seconds: float) -> None:
    """Busy-loop for `seconds` of this thread's CPU time (holding the GIL, as Python work does)."""
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


class BenchEnv(env.BenchEnv):
    """``step`` burns ``ORS_BENCH_STEP_CPU_MS`` of CPU, then adds as before."""

    @tool
    async def step(self, params: env.StepInput) -> ToolOutput:
        """Burn CPU on the event loop, then add n to the running total.

        Async on purpose: a sync tool would run in a thread, and its
        fight with the event loop for the GIL would leave the one core half
        idle, flattering the ratio with a single-process artefact."""
        burn_cpu(STEP_CPU_S)
        return super().step(params)
