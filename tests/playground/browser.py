"""Headless Debian Chromium, driven by selenium, cut off from every network but loopback.

Every host name but 127.0.0.1 fails to resolve and every request that is not
to loopback goes to a proxy that is not there, so a page that needs anything
from the internet (a CDN, a font) visibly breaks. Chromium's DevTools
performance log records every request the page makes and its console log
every error (a failed load, a Content-Security-Policy violation, an
uncaught exception); `Browser.assert_clean` checks both.
"""

from __future__ import annotations

import json
import tempfile
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, TypeVar
from urllib.parse import urlsplit

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.tooling import chromium_and_driver

T = TypeVar("T")
WAIT_S = 20.0
#: A proxy address nothing listens on (the discard port of loopback): requests
#: that are not to loopback fail there instead of leaving the machine.
NO_PROXY_THERE = "http://127.0.0.1:9"
LOCAL_SCHEMES = ("data", "chrome")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1400,1300", f"--proxy-server={NO_PROXY_THERE}",
)


def _network_flags(rebound_names: Sequence[str]) -> list[str]:
    """Every name but 127.0.0.1 unresolvable, but `rebound_names`: those resolve to 127.0.0.1 and
    are reached without the proxy, as a DNS-rebinding page's name is once it has been rebound."""
    rules = [f"MAP {name} 127.0.0.1" for name in rebound_names]
    flags = ["--host-resolver-rules=" + ", ".join([*rules, "MAP * ~NOTFOUND", "EXCLUDE 127.0.0.1"])]
    if rebound_names:
        flags.append("--proxy-bypass-list=" + ";".join(rebound_names))
    return flags


class Browser:
    """One Chromium window on the server at `origin` (`http://127.0.0.1:PORT`)."""

    def __init__(self, driver: webdriver.Chrome, origin: str) -> None:
        self.driver = driver
        self.origin = origin
        self._console: list[dict[str, Any]] = []
        self._requests: list[str] = []

    def open(self, path: str = "/") -> None:
        self.driver.get(self.origin + path)

    def wait(self, condition: Callable[[webdriver.Chrome], T], what: str) -> T:
        """Poll `condition` until it is truthy; fail naming `what`. A poll that read an element
        the page replaced meanwhile (the live view redraws its rows every few seconds) polls again."""
        return WebDriverWait(self.driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda driver: condition(driver), message=what)

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        return self.find(css).text

    def wait_for(self, css: str, what: str) -> WebElement:
        """The first element matching `css`, once there is one."""
        return self.wait(lambda driver: (driver.find_elements(By.CSS_SELECTOR, css) or [None])[0], what)

    def wait_for_text(self, css: str, text: str) -> None:
        self.wait(lambda driver: any(text in element.text for element in driver.find_elements(By.CSS_SELECTOR, css)),
                  f"{text!r} in {css}")

    def _drain(self) -> None:
        self._console.extend(self.driver.get_log("browser"))
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                self._requests.append(message["params"]["request"]["url"])

    def console_errors(self) -> list[str]:
        """The console's errors so far (failed loads, CSP violations, exceptions)."""
        self._drain()
        return [entry["message"] for entry in self._console if entry["level"] == "SEVERE"]

    def requested_urls(self) -> list[str]:
        """Every URL the page requested so far."""
        self._drain()
        return list(self._requests)

    def foreign_requests(self) -> list[str]:
        """Requests to anything but the server: another host, port or scheme. `data:` URLs stay
        in the page, and `chrome:` ones are the browser's own start page, never the network."""
        server = urlsplit(self.origin)
        return [url for url in self.requested_urls()
                if urlsplit(url).scheme not in LOCAL_SCHEMES and urlsplit(url)[:2] != server[:2]]

    def assert_clean(self, expected_errors: Callable[[str], bool] = lambda message: False) -> None:
        """No console error (but those `expected_errors` accepts) and no request to another host."""
        errors = [error for error in self.console_errors() if not expected_errors(error)]
        assert errors == [], f"console errors: {errors}"
        foreign = self.foreign_requests()
        assert foreign == [], f"requests to another host: {foreign}"
        assert self.requested_urls(), "the performance log recorded no request at all"

    def screenshot(self, path: str) -> None:
        assert self.driver.save_screenshot(path)


@contextmanager
def chromium(origin: str, rebound_names: Sequence[str] = ()) -> Iterator[Browser]:
    """A fresh headless Chromium (its own profile) for the server at `origin`; `rebound_names`
    resolve to 127.0.0.1 (see `_network_flags`)."""
    browser_path, driver_path = chromium_and_driver()
    options = webdriver.ChromeOptions()
    options.binary_location = browser_path
    for flag in [*FLAGS, *_network_flags(rebound_names)]:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory(prefix="ors-chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        # The driver's path given: selenium's own driver manager (which downloads) never runs.
        driver = webdriver.Chrome(options=options, service=Service(driver_path))
        try:
            browser = Browser(driver, origin)
            driver.get_log("browser"), driver.get_log("performance")  # the start page's, not the server's
            yield browser
        finally:
            driver.quit()
