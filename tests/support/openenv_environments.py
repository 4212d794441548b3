"""OpenEnv environments written on openenv-core's own base classes, for the adapter's
tests (tests/mcp/test_openenv.py): a guessing game (`Environment`, typed action and
observation, an image on success), the same one episode at a time, and a calculator
(`MCPEnvironment`, FastMCP tools, a rubric-like reward on `answer`)."""

from __future__ import annotations

import base64
import threading
from typing import Any, Optional

from fastmcp import FastMCP
from mcp.types import ImageContent
from openenv.core.env_server import Action, Environment, MCPEnvironment, Observation, State
from openenv.core.env_server.mcp_types import CallToolAction
from pydantic import Field

#: A 1x1 PNG, as the guessing game's picture and the calculator's.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="
)
PIXEL_DATA_URL = "data:image/png;base64," + base64.b64encode(PIXEL).decode()
#: What the calculator's `answer` is rewarded for.
CALCULATOR_ANSWER = 42


def secret_of(seed: int) -> int:
    """The number an episode reset with `seed` hides."""
    return seed * 7 % 10


class GuessAction(Action):
    """Guess the hidden number."""

    guess: int = Field(ge=0, le=9, description="A number from 0 to 9.")


class GuessObservation(Observation):
    message: str
    picture: Optional[str] = None
    #: How many other episodes of the class were live when this one reset.
    others_live: int = 0


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    """Guess a number from 0 to 9: `higher`/`lower` hints, reward 1 and the end when right."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    _live = 0
    _lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.secret = 0
        with GuessEnvironment._lock:
            type(self)._live += 1
        self._closed = False

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self.secret = secret_of(seed or 0)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message=f"Guess my number from 0 to 9 (attempts: {kwargs.get('attempts', 'any')}).",
                                others_live=type(self)._live - 1, metadata={"seed": seed})

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.secret:
            return GuessObservation(message="right", picture=PIXEL_DATA_URL, reward=1.0, done=True,
                                    metadata={"steps": self._state.step_count})
        hint = "higher" if action.guess < self.secret else "lower"
        return GuessObservation(message=hint, reward=0.0, done=False, metadata={"steps": self._state.step_count})

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with GuessEnvironment._lock:
                type(self)._live -= 1


class SoloGuessEnvironment(GuessEnvironment):
    """The guessing game, with its instances sharing state: one session at a time."""

    SUPPORTS_CONCURRENT_SESSIONS = False
    _live = 0


class CalculatorEnvironment(MCPEnvironment):
    """FastMCP tools `add`, `picture` and `answer`; `answer` is rewarded (1 for 42) and ends the episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("calculator")

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool()
        def picture() -> ImageContent:
            """A picture."""
            return ImageContent(type="image", data=base64.b64encode(PIXEL).decode(), mimeType="image/png")

        @mcp.tool()
        def answer(value: int) -> str:
            """Give the final answer."""
            return "right" if value == CALCULATOR_ANSWER else "wrong"

        super().__init__(mcp)
        self._state = State(step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id, step_count=0)
        return CalculatorObservation(prompt=f"Compute, then answer (seed {seed}).")

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and action.tool_name == "answer" and observation.error is None:
            observation.reward = float(action.arguments.get("value") == CALCULATOR_ANSWER)
            observation.done = True
        return observation

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        raise ValueError(f"{type(action).__name__}: only MCP tool calls are understood")

    @property
    def state(self) -> State:
        return self._state


class CalculatorObservation(Observation):
    prompt: str
