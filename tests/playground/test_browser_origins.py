"""The Host and Origin rule in a real browser (headless Debian Chromium): a page
whose name was rebound to 127.0.0.1 gets nothing from the server, a page of
another origin cannot create an episode, an allowed one can (CORS, preflights
included), and the playground works from its own origin under any loopback
name. Through raw HTTP: tests/reliability/test_host_and_origin.py."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

from selenium.webdriver.support.ui import Select

from tests.playground.browser import chromium
from tests.playground.conftest import ENVIRONMENTS
from tests.support.servers import ServeProcess, start_serve

REBOUND_NAME = "rebound.example"
#: From a page, the episode an agent would run: a session id, an episode, a tool call.
RUN_AN_EPISODE = """
const [server, done] = [arguments[0], arguments[arguments.length - 1]];
(async () => {
  try {
    let answer = await fetch(server + "/create_session", {method: "POST"});
    const sid = (await answer.json()).sid;
    const headers = {"Content-Type": "application/json", "X-Session-ID": sid};
    answer = await fetch(server + "/create", {method: "POST", headers,
                                              body: JSON.stringify({split: "train", index: 0})});
    if (!answer.ok) return done("create answered " + answer.status);
    answer = await fetch(server + "/arithmetic/call", {method: "POST", headers,
                         body: JSON.stringify({name: "calculator", input: {a: 40, b: 2, op: "+"}})});
    done(answer.status + " " + await answer.text());
  } catch (error) {
    done("refused: " + error);
  }
})();
"""


class _BlankPage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><title>a page served elsewhere</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def page_elsewhere() -> Iterator[str]:
    """A blank page on another loopback port (another origin); its origin."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BlankPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def port_of(url: str) -> str:
    return url.rsplit(":", 1)[1]


def test_a_page_rebound_to_loopback_gets_a_misdirected_answer_not_the_playground(server: ServeProcess) -> None:
    rebound = f"http://{REBOUND_NAME}:{port_of(server.http_url)}"
    with chromium(rebound, rebound_names=[REBOUND_NAME]) as browser:
        browser.open("/")
        browser.wait_for_text("body", "DNS rebinding")
        assert browser.find_all("#status") == []
        assert browser.driver.execute_script("return document.title") == ""


def test_the_playground_works_from_its_own_origin_under_another_loopback_name(server: ServeProcess) -> None:
    # (The browser's resolver knows only 127.0.0.1: localhost is given to it, as the system's would.)
    with chromium(f"http://localhost:{port_of(server.http_url)}", rebound_names=["localhost"]) as browser:
        browser.open("/")
        browser.wait_for_text("#status", "Connected")
        Select(browser.find("#env")).select_by_value("arithmetic")
        browser.wait(lambda _: browser.find("#start").is_enabled(), "the task form to be ready")
        browser.find("#start").click()
        browser.wait_for("form.tool[data-tool=calculator]", "the calculator tool's form")
        browser.assert_clean()


def test_a_page_of_another_origin_cannot_run_an_episode(server: ServeProcess) -> None:
    with page_elsewhere() as origin, chromium(origin) as browser:
        browser.open("/")
        browser.driver.set_script_timeout(20)
        outcome = browser.driver.execute_async_script(RUN_AN_EPISODE, server.http_url)
        assert outcome.startswith("refused: TypeError"), outcome
        assert any("CORS" in error for error in browser.console_errors())


def test_an_allowed_origins_page_runs_an_episode() -> None:
    with page_elsewhere() as origin, \
            start_serve(*ENVIRONMENTS, "--http-port", "0", "--allowed-origin", origin) as allowing, \
            chromium(origin) as browser:
        browser.open("/")
        browser.driver.set_script_timeout(20)
        outcome = browser.driver.execute_async_script(RUN_AN_EPISODE, allowing.http_url)
        assert outcome.startswith("200 ") and "42" in outcome, outcome
        assert browser.console_errors() == []
