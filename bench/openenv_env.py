"""The OpenEnv environment of ``python -m bench --ecosystems`` (bench/ecosystems.py), on
openenv-core's base classes: reset, then count 1, 2, 3, 4; the fourth step is rewarded
and ends the episode (the shape of bench.env's episodes)."""

from typing import Any, Optional

from openenv.core.env_server import Action, Environment, Observation, State

#: The count that ends an episode.
LAST = 4


class CountAction(Action):
    n: int


class CountObservation(Observation):
    message: str


class CountEnvironment(Environment[CountAction, CountObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> CountObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return CountObservation(message=f"Count from 1 to {LAST}.")

    def step(self, action: CountAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CountObservation:
        self._state.step_count += 1
        if action.n != self._state.step_count:
            return CountObservation(message="wrong", reward=0.0, done=True)
        done = action.n == LAST
        return CountObservation(message=str(action.n), reward=1.0 if done else 0.0, done=done)

    @property
    def state(self) -> State:
        return self._state
