"""How to add an optional extra (`mcp`, `otel`, `openenv`, ...) to this installation of ors-grpc.

ors-grpc is installed from a checkout or a wheel, not from a package index,
so `pip install 'ors-grpc[EXTRA]'` finds nothing: every hint that names an
extra names the command for the checkout or wheel this one came from.
"""

from __future__ import annotations

import importlib.metadata
import json
import shlex
import urllib.parse
import urllib.request

__all__ = ["extra_install_command"]


def extra_install_command(extra: str) -> str:
    """The pip command that adds `extra` to this installation of ors-grpc: from the
    checkout or wheel it was installed from (pip records it in `direct_url.json`), editable if it is."""
    # The first installation that has the record (a checkout's own `ors_grpc.egg-info` has none).
    texts = (dist.read_text("direct_url.json") for dist in importlib.metadata.distributions(name="ors-grpc"))
    try:
        record = json.loads(next((text for text in texts if text), "{}"))
    except ValueError:
        record = {}
    url = urllib.parse.urlsplit(record.get("url", ""))
    if url.scheme != "file":
        return f"pip install '.[{extra}]' in the ors-grpc checkout"
    where = urllib.request.url2pathname(url.path)
    editable = "-e " if record.get("dir_info", {}).get("editable") else ""
    return f"pip install {editable}{shlex.quote(where + f'[{extra}]')}"
