"""The pool of worker processes, in the manner of gunicorn's arbiter: one
table of processes (`process_table`) and one supervising loop that, on every
tick, reaps the processes that ended, kills those the watchdog condemns and
spawns up to what the placement wants, backing off while processes fail
young (`backoff`). Processes are started by the spawner it is given; which
process takes an episode is the placement's call. docs/workers.md has the
design: how workers start, faults, stalls."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Callable, Optional

from ors_grpc._runtime.workers.backoff import RestartBackoff
from ors_grpc._runtime.workers.connection import WorkerConnection, none_up
from ors_grpc._runtime.workers.hop import Setup
from ors_grpc._runtime.workers.listener import HopListener
from ors_grpc._runtime.workers.placement import SPAWN, Placement
from ors_grpc._runtime.workers.process_table import ProcessState, ProcessTable, WorkerProcess
from ors_grpc._runtime.workers.spawner import Spawner
from ors_grpc._runtime.workers.startup import WORKER_START_TIMEOUT_S, WorkerStartupError
from ors_grpc._runtime.workers.watchdog import Watchdog, rss_bytes
from ors_grpc._generated.ors.v1 import errors_pb2
from ors_grpc.observability import metrics
from ors_grpc.protocol.errors import CRASH_CAUSE_KEY, ORSError, exit_text

__all__ = ["WorkerPool"]

logger = logging.getLogger("ors_grpc.workers")

#: Seconds between two ticks while a process is starting (how soon a start that failed is seen).
STARTING_TICK_S = 0.05
#: The longest tick.
IDLE_TICK_S = 1.0


class WorkerPool:
    """Worker processes for one server: started, placed, watched, replaced."""

    def __init__(
        self, setup: Setup, placement: Placement, spawner: Spawner, watchdog: Watchdog,
        *, clock: Optional[Callable[[], float]] = None,
    ) -> None:
        self._setup = setup
        self._placement = placement
        self._spawner = spawner
        self._watchdog = watchdog
        self._clock = clock or asyncio.get_running_loop().time
        self._table = ProcessTable()
        self._backoff = RestartBackoff()
        self._listener = HopListener(self._table, setup, self._clock, on_ready=self._started,
                                     on_failed=self._start_failed)
        self._worker_ids = itertools.count(1)
        #: Processes whose hop closed, for the next reap.
        self._ended: list[WorkerProcess] = []
        self._wakeup = asyncio.Event()
        #: Set after every tick and every start: what `for_catalog` waits on.
        self._changed = asyncio.Event()
        self._loop_task: Optional[asyncio.Task[None]] = None
        self._closing = False
        #: Whether the current run of failed starts was logged (with its traceback): once per run.
        self._failure_reported = False
        self._on_availability: Callable[[bool], None] = lambda available: None
        self._available = True
        self._untrack_metrics: Callable[[], None] = lambda: None

    # --- the pool's life -------------------------------------------------------

    async def start(self) -> None:
        """Start every process the placement wants; WorkerStartupError (with the traceback) when one cannot."""
        await self._listener.open()
        try:
            await self._spawner.start(self._setup, self.wake)
            starting = [self._spawn() for _ in range(self._placement.to_spawn(self._table))]
            await self._until_started(starting)
        except BaseException:
            await self.close()
            raise
        self._untrack_metrics = metrics.track_workers(self._readings)
        self._loop_task = asyncio.get_running_loop().create_task(self._supervise(), name="ors-worker-pool")
        logger.info("workers_started count=%d pids=%s", len(starting), ",".join(str(p.pid) for p in starting))

    async def _until_started(self, starting: list[WorkerProcess]) -> None:
        while any(process.state is ProcessState.STARTING for process in starting):
            now = self._clock()
            for process in starting:
                problem = self._start_problem(process, now)
                if problem is not None:
                    raise problem
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), STARTING_TICK_S)
            except asyncio.TimeoutError:
                pass

    async def close(self) -> None:
        """Stop every process (after the session table ended its episodes)."""
        self._closing = True
        self._untrack_metrics()
        if self._loop_task is not None:
            self._loop_task.cancel()
        self._listener.close()
        started = [process.connection for process in self._table if process.state is not ProcessState.STARTING]
        for process in self._table.in_state(ProcessState.STARTING):
            process.connection.process.kill()
        await asyncio.gather(*(connection.stop() for connection in started))
        await self._spawner.stop()

    def watch_availability(self, on_change: Callable[[bool], None]) -> None:
        self._on_availability = on_change

    def wake(self) -> None:
        """Something happened that the supervising loop should see now."""
        self._wakeup.set()

    # --- the supervising loop ----------------------------------------------------

    async def _supervise(self) -> None:
        while not self._closing:
            self._wakeup.clear()
            try:
                now = self._clock()
                self.reap(now)
                self.murder(now)
                await self.manage(now)
                self._notify_availability()
            except Exception:  # a bug here must not end supervision
                logger.exception("worker_pool_tick_failed")
            self._changed.set()
            try:
                await asyncio.wait_for(self._wakeup.wait(), self._next_tick_s(self._clock()))
            except asyncio.TimeoutError:
                pass

    def _next_tick_s(self, now: float) -> float:
        if self._table.count(ProcessState.STARTING):
            return STARTING_TICK_S
        deadline = now + IDLE_TICK_S
        due = self._watchdog.next_due(now)
        if due is not None:
            deadline = min(deadline, due)
        if self._backoff.resume_at > now:
            deadline = min(deadline, self._backoff.resume_at)
        return max(0.0, deadline - now)

    def reap(self, now: float) -> None:
        """Forget the processes that ended (counting their deaths as the placement says) and the starts that failed."""
        for pid, status, started_at in self._spawner.lost():
            if self._closing:
                continue
            logger.error("episode_template_exited pid=%d %s episode_processes_lost=%d", pid, exit_text(status),
                         len(self._table))
            self._count_failure(now, young=self._backoff.ended(now - started_at, now))
        ended, self._ended = self._ended, []
        for process in ended:
            self._reap_one(process, now)
        for process in self._table.in_state(ProcessState.STARTING):
            problem = self._start_problem(process, now)
            if problem is not None:
                self._table.remove(process)
                if process.connection.process.poll() is None:
                    process.connection.process.kill()
                process.connection.start_failed(problem)
                if self._spawner.up:  # else it went with its template: counted there
                    self._report_start_failure(problem)
                    self._count_failure(now, young=self._backoff.failed(now))

    def _reap_one(self, process: WorkerProcess, now: float) -> None:
        self._table.remove(process)
        if process.heartbeats is not None:
            process.heartbeats.close()
        connection = process.connection
        if connection.stopping or self._closing:
            return
        if connection.status != 0 or connection.hosts:
            assert connection.crash is not None
            logger.error("worker_exited worker=%d pid=%d %s episodes_lost=%d", process.worker_id, process.pid,
                         exit_text(connection.status), len(connection.hosts))
            metrics.worker_died(connection.crash.metadata[CRASH_CAUSE_KEY])
        if not self._placement.start_proves_health:
            self._count_failure(now, young=self._backoff.ended(now - process.started_at, now))

    def murder(self, now: float) -> None:
        """Kill the processes the watchdog condemns (over the memory limit, stalled)."""
        for kill in self._watchdog.look(now, self._table.started()):
            logger.error("worker_killed %s", kill.why)
            kill.process.connection.kill(kill.cause)

    async def manage(self, now: float) -> None:
        """Spawn up to what the placement wants (a template first, if it was lost), unless backing off."""
        if self._closing or not self._backoff.may_start(now):
            return
        if not self._spawner.up:
            try:
                await self._spawner.revive(now)
            except WorkerStartupError as exc:
                self._report_start_failure(exc)
                self._count_failure(self._clock(), young=self._backoff.failed(self._clock()))
                return
            if self._closing:
                return
        for _ in range(self._placement.to_spawn(self._table)):
            self._spawn()

    # --- the phases' helpers -----------------------------------------------------

    def _spawn(self, *, reserved: bool = False) -> WorkerProcess:
        worker_id = next(self._worker_ids)
        connection = WorkerConnection(worker_id, self._spawner.spawn(worker_id, self._listener.path),
                                      self._connection_lost)
        process = WorkerProcess(worker_id, connection, self._clock(), reserved=reserved)
        self._table.add(process)
        return process

    def _started(self, process: WorkerProcess, writer: asyncio.StreamWriter) -> None:
        """`process` completed its handshake."""
        if process not in self._table or self._closing:
            writer.close()
            process.connection.process.kill()
            return
        process.heard_at = self._clock()
        process.connection.attach(writer)
        self._table.move(process, ProcessState.CLAIMED if process.reserved else ProcessState.READY)
        self._failure_reported = False
        if self._placement.start_proves_health:
            self._backoff.proved()
        elif self._loop_task is not None:  # (not one of the first)
            logger.info("worker_started worker=%d pid=%d", process.worker_id, process.pid)
        self._changed.set()
        self.wake()

    def _start_failed(self, process: WorkerProcess, error: WorkerStartupError) -> None:
        process.connection.start_failed(error)
        self._changed.set()
        self.wake()

    def _start_problem(self, process: WorkerProcess, now: float) -> Optional[WorkerStartupError]:
        """Why a STARTING process will not start (it failed its handshake, exited, took too long), or None."""
        connection = process.connection
        if connection.connected.done():
            error = connection.connected.exception()
            return error if isinstance(error, WorkerStartupError) else None
        status = connection.process.poll()
        if status is not None:
            return WorkerStartupError(f"worker {process.worker_id} {exit_text(status)} while starting")
        if now - process.started_at > WORKER_START_TIMEOUT_S:
            return WorkerStartupError(f"worker {process.worker_id} did not start within {WORKER_START_TIMEOUT_S:g}s")
        return None

    def _connection_lost(self, connection: WorkerConnection) -> None:
        process = self._table.get(connection.worker_id)
        if process is not None and process.connection is connection:
            self._ended.append(process)
            self.wake()

    def _report_start_failure(self, exc: WorkerStartupError) -> None:
        """Log why a process could not start (its traceback) once per run of failed starts."""
        if not self._failure_reported:
            self._failure_reported = True
            logger.error("worker_start_failed %s", exc)

    def _count_failure(self, now: float, *, young: bool) -> None:
        """After a failure was told to the backoff (`young`: it just began a crash loop)."""
        if young:
            logger.error("worker_crash_loop failures=%d backoff_s=%s workers_up=%d",
                         self._backoff.failures, self._backoff.delay_s, len(self._table.started()))
        self._notify_availability()

    def _can_spawn(self) -> bool:
        return self._spawner.up and not self._backoff.failing

    def _stalled(self, process: WorkerProcess) -> bool:
        return self._watchdog.stalled(process)

    def serving(self) -> bool:
        """Whether new episodes can be served now (health SERVING)."""
        return self._spawner.up and self._placement.serving(self._table, can_spawn=self._can_spawn(),
                                                            stalled=self._stalled)

    def _notify_availability(self) -> None:
        available = self.serving()
        if available != self._available:
            self._available = available
            logger.log(logging.INFO if available else logging.ERROR, "workers_available=%s", available)
            self._on_availability(available)

    # --- placing episodes and class-level calls ----------------------------------------

    def for_episode(self) -> WorkerConnection:
        """The connection a new episode lives on (ENVIRONMENT_STARTING when none can take it)."""
        choice = self._placement.for_episode(self._table, can_spawn=self._can_spawn() and not self._closing,
                                             stalled=self._stalled)
        if choice is None:
            if self._placement.serving(self._table, can_spawn=False):  # up, but every one stalled
                raise ORSError(errors_pb2.ERROR_REASON_ENVIRONMENT_STARTING,
                               "every worker process able to take an episode is stalled (its event loop held): "
                               "retry shortly")
            if not self._placement.one_episode_per_process:
                raise none_up("no worker process is up")
            if not self._spawner.up:
                raise none_up("no episode process can start: the template process is being restarted")
            raise none_up("no episode process could start")
        if choice == SPAWN:  # none idle: a process of its own all the same, its calls wait for it to start
            process = self._spawn(reserved=True)
        else:
            process = choice
            if not self._placement.one_episode_per_process:
                return process.connection  # nothing changed that the supervising loop must see
            self._table.move(process, ProcessState.CLAIMED)
        self.wake()  # one idle process fewer: the loop starts another
        return process.connection

    async def for_catalog(self) -> WorkerConnection:
        """The connection for a class-level call, waiting (up to the start timeout) while the pool refills."""
        deadline = self._clock() + WORKER_START_TIMEOUT_S
        while True:
            process = self._placement.for_catalog(self._table, stalled=self._stalled)
            if process is not None:
                return process.connection
            remaining = deadline - self._clock()
            if not self.serving() or remaining <= 0:
                raise none_up("no process is up for the environment's own calls")
            self._changed.clear()
            self.wake()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def _readings(self) -> list[metrics.WorkerReading]:
        """The processes up and serving, read at a metrics scrape (their memory too: no call pays for it)."""
        return [metrics.WorkerReading(process.worker_id, process.connection.episodes, rss_bytes(process.pid))
                for process in self._table.started() if process.connection.alive]
