"""An environment whose setup waits for a file, to test calls made while an episode is still starting.

`GatedSetupEnv.setup()` returns once the file named by the environment variable ORS_TEST_SETUP_GATE
exists (the test creates it); until then, served with a short `--setup-wait`, the episodes' calls are
answered ENVIRONMENT_STARTING. No timing decides anything.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.support.environments import EchoEnv


class GatedSetupEnv(EchoEnv):
    """EchoEnv whose setup lasts until the gate file exists."""

    async def setup(self) -> None:
        gate = Path(os.environ["ORS_TEST_SETUP_GATE"])
        while not gate.exists():
            await asyncio.sleep(0.02)
