"""CPU-heavy variants of ``bench.env:BenchEnv`` for ``python -m bench --placements``.

Simulators, game engines and graders spend their tools' time in Python on
the CPU; one process runs that on one core at a time (one GIL). Each ``step``
here spends ``ORS_BENCH_CPU_MS`` (2 by default) of pure-Python CPU, then adds
as before. ``SyncCpuEnv``'s ``step`` is a plain method (the server runs it in
a thread: it is over the 2 ms a function may take on the loop);
``AsyncCpuEnv``'s is an ``async def`` (it runs on the event loop). Both are
named ``benchenv``, so the load generator runs unchanged.
"""

import os

from bench import env
from bench.busy_env import burn_cpu
from ors_grpc import ToolOutput, tool

STEP_CPU_S = float(os.environ.get("ORS_BENCH_CPU_MS", "2")) / 1000


class SyncCpuEnv(env.BenchEnv):
    """``step`` is sync and burns ``STEP_CPU_S`` of CPU."""

    @classmethod
    def name(cls) -> str:
        return "BenchEnv"

    @tool
    def step(self, params: env.StepInput) -> ToolOutput:
        """Burn CPU, then add n to the running total."""
        burn_cpu(STEP_CPU_S)
        return super().step(params)


class AsyncCpuEnv(env.BenchEnv):
    """``step`` is ``async def`` and burns ``STEP_CPU_S`` of CPU on the event loop."""

    @classmethod
    def name(cls) -> str:
        return "BenchEnv"

    @tool
    async def step(self, params: env.StepInput) -> ToolOutput:
        """Burn CPU on the event loop, then add n to the running total."""
        burn_cpu(STEP_CPU_S)
        return super().step(params)
