"""The server's log lines: one `key=value` format for the server, its workers
and `Server(...).run()` scripts, so that one log reads as one format."""

from __future__ import annotations

import logging
import sys
from typing import Optional, Union

__all__ = ["configure_logging", "line_format"]


def line_format(worker: Optional[str] = None) -> str:
    """The format of a line; a worker's lines name the worker."""
    tag = f" worker={worker}" if worker is not None else ""
    return f"time=%(asctime)s level=%(levelname)s{tag} logger=%(name)s msg=%(message)s"


def configure_logging(level: Union[int, str], *, worker: Optional[str] = None, force: bool = False) -> None:
    """Lines to stderr at `level` (`force`: replacing a handler already there, as in a forked child)."""
    logging.basicConfig(level=level, stream=sys.stderr, format=line_format(worker), force=force)
    # grpc's asyncio layer logs `Loaded running loop` at DEBUG for every
    # call: at DEBUG it would drown the server's own lines.
    numeric = level if isinstance(level, int) else logging.getLevelName(level)
    logging.getLogger("grpc._cython.cygrpc").setLevel(max(logging.INFO, numeric))
