"""Warm episodes: episodes prepared ahead of their creation (PrepareEpisodes).

`SessionTable.prepare` starts episodes without a session and hands them to
the pool; a later creation of the same environment and task, with the same
secrets and API key (and under the session id, if one was reserved for it),
claims one instead of paying for a setup of its own. The claim key holds the task as
canonical JSON and an HMAC of the secrets and key under a per-process key,
so the pool keeps no comparable copy of a secret. Unclaimed episodes are
ended after `ttl_s`, or `setup_timeout_s` without a finished setup, each
freeing its place in the session limit. What a claim needs and why:
docs/http-bridge.md, "Warm episodes"; behind a load balancer:
docs/deployment.md, "Warm episodes that route".
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets as secrets_module
from collections import deque
from typing import Any, Awaitable, Callable

from ors_grpc.observability import metrics
from ors_grpc.protocol import json_text
from ors_grpc.protocol.constants import DEFAULT_WARM_SETUP_TIMEOUT_S

from ors_grpc._runtime.session import Session
from ors_grpc.authoring.environment import Environment

__all__ = ["MAX_PREPARE_PER_REQUEST", "WarmPool"]

logger = logging.getLogger("ors_grpc.warm_pool")

#: Most episodes one PrepareEpisodes request may ask for.
MAX_PREPARE_PER_REQUEST = 4096

ClaimKey = tuple[type, str, bytes]


class _Held:
    """One prepared episode in the pool, and its expiry: the setup bound
    while it sets up, then the TTL."""

    __slots__ = ("session", "key", "reserved_for", "expiry", "in_pool")

    def __init__(self, session: Session, key: ClaimKey, reserved_for: str | None) -> None:
        self.session = session
        self.key = key
        #: The session id only whose creation may claim it, if it was reserved.
        self.reserved_for = reserved_for
        self.expiry: asyncio.TimerHandle | None = None
        self.in_pool = True


class WarmPool:
    """Prepared episodes: by claim key, oldest first, or by the session id reserved for each."""

    def __init__(
        self, *, ttl_s: float, end: Callable[[Session], Awaitable[None]],
        setup_timeout_s: float = DEFAULT_WARM_SETUP_TIMEOUT_S,
    ) -> None:
        self.ttl_s = ttl_s
        self.setup_timeout_s = setup_timeout_s
        self._end = end
        self._hmac_key = secrets_module.token_bytes(32)
        self._held: dict[ClaimKey, deque[_Held]] = {}
        self._reserved: dict[str, _Held] = {}
        self._count = 0
        self._ending: set[asyncio.Task[None]] = set()

    @property
    def count(self) -> int:
        """Episodes held now (preparing or ready); they count as sessions."""
        return self._count

    def count_by_environment(self) -> dict[type, int]:
        """Episodes held now, by environment class."""
        counts: dict[type, int] = {}
        for held in self._everything():
            counts[held.key[0]] = counts.get(held.key[0], 0) + 1
        return counts

    def is_reserved(self, sid: str) -> bool:
        """Whether a held episode is reserved for session id `sid`."""
        return sid in self._reserved

    def hold(
        self, session: Session, task_spec: dict[str, Any], secrets: dict[str, str], api_key: str,
        reserved_for: str | None = None,
    ) -> None:
        """Keep a just started episode for a creation of the same key to claim
        (only the creation under session id `reserved_for`, when given)."""
        held = _Held(session, self._claim_key(session.env_cls, task_spec, secrets, api_key), reserved_for)
        if reserved_for is None:
            self._held.setdefault(held.key, deque()).append(held)
        else:
            self._reserved[reserved_for] = held
        self._count += 1
        metrics.warm_episode_prepared(session.env_cls)
        if session.setup_task is None:
            self._start_ttl(held)
        else:
            held.expiry = asyncio.get_running_loop().call_later(self.setup_timeout_s, self._setup_timed_out, held)
            session.setup_task.add_done_callback(lambda _: self._start_ttl(held))

    def claim(
        self, env_cls: type[Environment], task_spec: dict[str, Any], secrets: dict[str, str], api_key: str,
        sid: str,
    ) -> Session | None:
        """The episode reserved for `sid` if it has this key, else the oldest
        unreserved one of this key, taken out of the pool; None if there is none."""
        if not self._count:
            return None  # the common case: no canonical JSON, no HMAC
        key = self._claim_key(env_cls, task_spec, secrets, api_key)
        held = self._reserved.get(sid)
        if held is None or held.key != key:
            queue = self._held.get(key)
            if not queue:
                return None
            held = queue[0]
        self._withdraw(held)
        metrics.warm_episode_ended(env_cls, "claimed")
        logger.debug("warm_episode_claimed env=%s reserved=%s", env_cls.name().lower(), held.reserved_for is not None)
        return held.session

    def cancel(
        self, env_cls: type[Environment], task_specs: list[dict[str, Any]], secrets: dict[str, str], api_key: str
    ) -> int:
        """End held episodes of these secrets and `api_key`: one of each
        task spec given (oldest first), or all of `env_cls` with none given.
        Returns how many. An episode reserved for a session id is cancelled
        only with all of its environment's."""
        if task_specs:
            queues = [self._held.get(self._claim_key(env_cls, spec, secrets, api_key)) for spec in task_specs]
            chosen = [queue[0] for queue in queues if queue]
        else:
            holder = self._holder(secrets, api_key)
            chosen = [held for held in self._everything() if held.key[0] is env_cls and held.key[2] == holder]
        for held in chosen:
            self._withdraw(held)
            self._end_in_background(held, "cancelled")
        if chosen:
            logger.info("warm_episodes_cancelled env=%s count=%d", env_cls.name().lower(), len(chosen))
        return len(chosen)

    async def close(self) -> None:
        """End every held episode and wait for those being ended (the server stops or drains)."""
        for held in self._everything():
            self._withdraw(held)
            self._end_in_background(held, "closed")
        if self._ending:
            await asyncio.wait(set(self._ending))

    def _claim_key(
        self, env_cls: type[Environment], task_spec: dict[str, Any], secrets: dict[str, str], api_key: str
    ) -> ClaimKey:
        return env_cls, json_text.canonical(task_spec), self._holder(secrets, api_key)

    def _holder(self, secrets: dict[str, str], api_key: str) -> bytes:
        """Who may claim or cancel: a keyed hash of the secrets and the API key."""
        holder = json_text.canonical([sorted(secrets.items()), api_key])
        return hmac.new(self._hmac_key, holder.encode(), hashlib.sha256).digest()

    def _everything(self) -> list[_Held]:
        """Every held episode, reserved ones first, then by key, oldest first."""
        return [*self._reserved.values(), *(held for queue in self._held.values() for held in queue)]

    def _withdraw(self, held: _Held) -> None:
        """Take `held` out of the pool (its queue, or its reservation)."""
        held.in_pool = False
        if held.reserved_for is not None:
            del self._reserved[held.reserved_for]
        else:
            queue = self._held[held.key]
            queue.remove(held)  # the first, unless it expired or is cancelled
            if not queue:
                del self._held[held.key]
        if held.expiry is not None:
            held.expiry.cancel()
            held.expiry = None
        self._count -= 1

    def _start_ttl(self, held: _Held) -> None:
        """The setup of `held` ended: it is torn down after the TTL unless claimed first."""
        if not held.in_pool:
            return  # claimed (or ended) while setting up
        if held.expiry is not None:
            held.expiry.cancel()  # the setup bound
        held.expiry = asyncio.get_running_loop().call_later(self.ttl_s, self._expire, held)

    def _setup_timed_out(self, held: _Held) -> None:
        """The setup of `held` did not end within the bound: cancel and end it, freeing its place."""
        if not held.in_pool:
            return
        held.expiry = None
        self._withdraw(held)
        self._end_in_background(held, "setup_timeout")
        logger.warning("warm_setup_timed_out env=%s setup_timeout_s=%s",
                       held.session.env_cls.name().lower(), self.setup_timeout_s)

    def _expire(self, held: _Held) -> None:
        if not held.in_pool:
            return
        held.expiry = None
        self._withdraw(held)
        self._end_in_background(held, "expired")
        logger.info("warm_episode_expired env=%s ttl_s=%s", held.session.env_cls.name().lower(), self.ttl_s)

    def _end_in_background(self, held: _Held, outcome: str) -> None:
        metrics.warm_episode_ended(held.session.env_cls, outcome)
        task = asyncio.get_running_loop().create_task(self._end(held.session), name="ors-warm-end")
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
