"""ors_grpc_betterproto/ is exactly what scripts/generate_betterproto.py makes from proto/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "ors_grpc_betterproto"

pytestmark = pytest.mark.timeout(120)


def _tree(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): path.read_text()
        for path in sorted(root.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def test_betterproto_tree_is_fresh(tmp_path: Path) -> None:
    out = tmp_path / "ors_grpc_betterproto"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_betterproto.py"), str(out)],
        check=True, capture_output=True, timeout=100,
    )
    fresh, committed = _tree(out), _tree(COMMITTED)
    assert sorted(fresh) == sorted(committed)
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"regenerate with: python scripts/generate_betterproto.py ({stale})"
