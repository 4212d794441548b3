"""Reading the code blocks of a Markdown page, for the tests that run a page's examples as written."""

from __future__ import annotations

import re
from pathlib import Path

#: A fenced block: its language and its code.
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: `print(...)  # what it prints`
EXPECTED = re.compile(r"^\s*print\(.*\)\s+# (.*)$")


def code_blocks(page: Path) -> list[tuple[str, str]]:
    """Every fenced block of `page`, as (language, code), in order."""
    return FENCE.findall(page.read_text())


def expected_prints(code: str) -> list[str]:
    """What a block's `print` lines say they print (their comments), in order."""
    return [match.group(1) for match in map(EXPECTED.match, code.splitlines()) if match]
