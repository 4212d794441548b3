"""The playground at `/` and Swagger UI at `/docs`, in a real browser (headless Debian Chromium
driven by selenium) that can reach nothing but the server on loopback.

Every test ends with `assert_clean`: no console error (a failed load, a CSP violation, an
uncaught exception) and no request to any host but the server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from selenium.webdriver.support.ui import Select

from http_bridge._openapi import OPERATIONS
from tests.playground.browser import Browser, chromium
from tests.playground.conftest import API_KEY, ENVIRONMENTS
from tests.playground.showcase_env import HOSTILE_OUTPUT, HOSTILE_TITLE
from tests.support.servers import ROOT, ServeProcess, start_bridge, start_serve

#: Set to a folder to keep the episode's screenshot there (docs/ holds the README's).
SCREENSHOT_DIR_ENV = "ORS_PLAYGROUND_SCREENSHOT_DIR"


@pytest.fixture
def browser(server: ServeProcess) -> Iterator[Browser]:
    with chromium(server.http_url) as opened:
        yield opened


def connect(browser: Browser, path: str = "/") -> None:
    browser.open(path)
    browser.wait_for_text("#status", "Connected")


def until_the_task_form_is_ready(browser: Browser) -> None:
    """The form takes a start once its environment's splits are in (until then it says it is loading)."""
    browser.wait(lambda _: browser.find("#start").is_enabled(), "the task form to be ready")


def choose_environment(browser: Browser, name: str) -> None:
    Select(browser.find("#env")).select_by_value(name)
    until_the_task_form_is_ready(browser)


def start_episode(browser: Browser, first_tool: str) -> None:
    until_the_task_form_is_ready(browser)
    browser.find("#start").click()
    browser.wait_for(f"form.tool[data-tool={first_tool}]", f"the {first_tool} tool's form")


def call(browser: Browser, tool: str, **fields: str) -> None:
    """Fill the tool's form (field name to typed text) and call it."""
    form = browser.find(f"form.tool[data-tool={tool}]")
    for name, text in fields.items():
        element = form.find_element("name", name)
        element.clear()
        element.send_keys(text)
    count = len(browser.find_all(".call-entry"))
    form.find_element("css selector", "button.call").click()
    browser.wait(lambda _: len(browser.find_all(".call-entry")) > count
                 and browser.find(".call-entry").get_attribute("data-state") != "running", f"the {tool} call's end")


def latest_call(browser: Browser) -> str:
    return browser.text(".call-entry")


def option_texts(browser: Browser, css: str) -> list[str]:
    return [option.text for option in Select(browser.find(css)).options]


def test_the_lists_say_they_are_loading_until_they_are_filled(browser: Browser) -> None:
    browser.open("/")
    # Whenever it is looked at, a list is either filled or says that it is loading: never empty.
    while "Connected" not in browser.text("#status"):
        for css in ("#env", "#split"):
            assert option_texts(browser, css), css
    until_the_task_form_is_ready(browser)
    assert option_texts(browser, "#env") == ["arithmetic", "showcase"] and browser.find("#env").is_enabled()
    assert option_texts(browser, "#split")[0] == "train (train)" and browser.find("#split").is_enabled()
    assert browser.find("#setup").get_attribute("aria-busy") == "false"
    browser.assert_clean()


def test_an_arithmetic_episode_runs_to_reward_one_and_finished(browser: Browser, tmp_path: Path) -> None:
    connect(browser)
    browser.wait_for_text("#task-json", '"question": "What is 12 + 30?"')
    start_episode(browser, "calculator")
    browser.wait_for_text("#prompt", "What is 12 + 30? Use the calculator, then submit the answer.")
    assert browser.text("#episode-state") == "running"

    call(browser, "calculator", a="12", b="30")
    entry = browser.find(".call-entry")
    assert entry.get_attribute("data-state") == "ok"
    assert entry.find_element("css selector", ".blocks").text == "42"
    assert entry.find_element("css selector", ".task-id").text.startswith("task ")
    assert entry.find_element("css selector", ".reward").text == "reward none"

    call(browser, "submit", answer="42")
    assert "Correct!" in latest_call(browser)
    assert browser.find(".call-entry .reward").text == "reward 1.0"
    assert browser.find(".call-entry .finished").text == "finished"
    assert browser.text("#total-reward") == "1.0"
    assert browser.text("#episode-state") == "finished"

    call(browser, "submit", answer="42")  # the episode is over: refused, with its reason
    assert browser.find(".call-entry").get_attribute("data-state") == "refused"
    assert "refused (episode_finished)" in latest_call(browser)

    shot = tmp_path / "playground.png"
    browser.screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get(SCREENSHOT_DIR_ENV):
        shutil.copy(shot, Path(os.environ[SCREENSHOT_DIR_ENV]) / "playground.png")
    browser.assert_clean()


def test_a_tool_that_returns_an_image_shows_it_as_an_image(browser: Browser) -> None:
    connect(browser)
    choose_environment(browser, "showcase")
    start_episode(browser, "snapshot")
    call(browser, "snapshot")
    image = browser.find(".call-entry img")
    assert image.get_attribute("src").startswith("data:image/png;base64,iVBORw0KGgo")
    assert browser.driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image) == 8
    browser.assert_clean()


def test_markup_from_the_environment_shows_as_text_and_runs_nothing(browser: Browser) -> None:
    connect(browser)
    choose_environment(browser, "showcase")
    browser.wait_for_text("#task-json", "onerror")
    start_episode(browser, "snapshot")
    browser.wait_for_text("#prompt", HOSTILE_TITLE)
    call(browser, "snapshot")
    assert HOSTILE_OUTPUT in latest_call(browser)

    assert HOSTILE_TITLE.replace('"', '\\"') in browser.text("#task-json")  # the task's JSON, as text
    for region in ("#task-json", "#prompt", "#transcript"):
        assert browser.find_all(f"{region} script, {region} iframe, {region} b") == []
    assert browser.find_all("#prompt img, #task-json img") == []
    assert browser.driver.title == "ORS playground"  # neither the onerror nor the script ran
    browser.assert_clean()


def test_the_form_of_a_tool_makes_every_kind_of_field(browser: Browser) -> None:
    connect(browser)
    choose_environment(browser, "showcase")
    start_episode(browser, "order")
    form = browser.find("form.tool[data-tool=order]")
    assert form.find_element("name", "quantity").get_attribute("type") == "number"
    assert [option.text for option in Select(form.find_element("name", "size")).options] == ["—", "small", "large"]
    assert form.find_element("name", "gift").get_attribute("type") == "checkbox"
    Select(form.find_element("name", "size")).select_by_visible_text("large")
    form.find_element("name", "gift").click()
    form.find_element("name", "tags+").click()
    form.find_element("name", "tags+").click()
    call(browser, "order", name="tea", quantity="3", price="2.5", **{
        "tags.0": "green", "tags.1": "loose", "address.street": "Main St", "address.number": "7"})
    assert browser.find(".call-entry .blocks").text == (
        '{"address": {"number": 7, "street": "Main St"}, "gift": true, "name": "tea", "note": null, '
        '"price": 2.5, "quantity": 3, "size": "large", "tags": ["green", "loose"]}')

    form.find_element("css selector", ".raw-switch").click()  # the raw-JSON editor, prefilled from the form
    raw = form.find_element("name", "raw-json")
    assert '"street": "Main St"' in raw.get_attribute("value")
    raw.clear()
    raw.send_keys('{"name": "x", "quantity": 1, "price": 1, "size": "small", "address": {"street": "a", '
                  '"number": "not a number"}}')
    call(browser, "order")
    assert browser.find(".call-entry").get_attribute("data-state") == "refused"
    assert "refused (input_validation)" in latest_call(browser)
    browser.assert_clean()


def test_a_failing_tool_and_group_scoring(browser: Browser) -> None:
    connect(browser)
    choose_environment(browser, "showcase")
    start_episode(browser, "explode")
    call(browser, "explode")
    assert browser.find(".call-entry").get_attribute("data-state") == "failed"
    assert "failed: the showcase exploded" in latest_call(browser)

    browser.wait(lambda _: browser.find("#scoring").is_displayed(), "the group scoring form")
    candidates = browser.find("#candidates")
    candidates.clear()
    candidates.send_keys('[{"messages": [], "metadata": null}, {"messages": [{"role": "assistant", '
                         '"blocks": [{"type": "text", "text": "a"}]}], "metadata": null}]')
    browser.find("#score").click()
    browser.wait(lambda _: browser.find(".call-entry").get_attribute("data-state") == "ok", "the scores")
    scores = browser.text(".call-entry .scores")
    assert "reward 0.0" in scores and "reward 1.0" in scores and '"index": 1' in scores
    browser.assert_clean()


def test_the_copy_as_snippets_replay_the_last_call(browser: Browser, server: ServeProcess) -> None:
    connect(browser)
    start_episode(browser, "calculator")
    call(browser, "calculator", a="12", b="30")
    Select(browser.find("#snippet-kind")).select_by_visible_text("curl")
    curl = browser.text("#snippet")
    assert curl.startswith(f"curl -sN -X POST '{server.http_url}/arithmetic/call'")
    if shutil.which("curl") is not None:  # the same call again, on the page's session
        replay = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
        assert '"blocks":[{"text":"42"' in replay.stdout

    call(browser, "submit", answer="42")
    kinds = [option.text for option in Select(browser.find("#snippet-kind")).options]
    assert kinds == ["curl", "Python (ors.client)", "Python (openreward)", "Python (ors_grpc.client)", "TypeScript"]
    for kind in ("Python (ors.client)", "Python (openreward)"):  # the HTTP clients, run against the server
        Select(browser.find("#snippet-kind")).select_by_visible_text(kind)
        program = browser.text("#snippet")
        run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip().endswith("1.0 True"), (kind, run.stdout)
    Select(browser.find("#snippet-kind")).select_by_visible_text("TypeScript")
    assert 'episode.callTool("submit", {"answer":42})' in browser.text("#snippet")
    browser.assert_clean()


def test_the_api_key_is_asked_for_and_kept_in_memory_only(keyed_server: ServeProcess) -> None:
    with chromium(keyed_server.http_url) as browser:
        browser.open("/")
        browser.wait_for_text("#status", "This server needs an API key.")
        assert browser.find("#auth").is_displayed()
        assert option_texts(browser, "#env") == ["needs an API key"] and not browser.find("#env").is_enabled()
        assert not browser.find("#start").is_enabled()
        browser.find("#api-key").send_keys("wrong")
        browser.find("#auth button").click()
        browser.wait_for_text("#status", "That API key was refused.")
        browser.find("#api-key").send_keys(API_KEY)
        browser.find("#auth button").click()
        browser.wait_for_text("#status", "Connected: 2 environment(s).")
        assert not browser.find("#auth").is_displayed()
        assert browser.find("#api-key").get_attribute("value") == ""

        start_episode(browser, "calculator")
        call(browser, "calculator", a="1", b="2")
        assert browser.find(".call-entry .blocks").text == "3"
        Select(browser.find("#snippet-kind")).select_by_visible_text("Python (ors.client)")
        snippet = browser.text("#snippet")
        assert 'api_key=os.environ["ORS_API_KEY"]' in snippet and API_KEY not in snippet
        stored = browser.driver.execute_script(
            "return [localStorage.length, sessionStorage.length, document.cookie]")
        assert stored == [0, 0, ""]

        browser.open("/")  # a reload forgets the key
        browser.wait_for_text("#status", "This server needs an API key.")
        # The only errors: the browser's own lines for the 401s the page was answered.
        browser.assert_clean(expected_errors=lambda message: "status of 401" in message)


def test_the_live_view_counts_the_open_session_and_the_calls() -> None:
    with start_serve(*ENVIRONMENTS, "--http-port", "0") as server, chromium(server.http_url) as browser:
        connect(browser)

        def cell(column: str) -> str:
            return browser.text(f"#live-rows tr[data-environment=arithmetic] .{column}")

        browser.wait(lambda _: cell("open-sessions") == "0", "no open session at first")
        start_episode(browser, "calculator")
        browser.wait(lambda _: cell("open-sessions") == "1", "the live view counting the open session")
        call(browser, "calculator", a="2", b="2")
        browser.wait(lambda _: cell("latency-p50").endswith(" ms"), "a call latency")
        assert float(cell("calls-per-second")) > 0

        choose_environment(browser, "showcase")
        start_episode(browser, "explode")
        call(browser, "explode")
        browser.wait_for_text("#live-rows tr[data-environment=showcase] .recent-errors", "the showcase exploded")
        browser.wait(lambda _: cell("open-sessions") == "0", "the first episode ended when the second started")
        browser.assert_clean()


def test_the_page_works_through_the_bridge_alone(server: ServeProcess) -> None:
    assert server.grpc_target is not None
    with start_bridge(server.grpc_target) as bridge, chromium(bridge.http_url) as browser:
        connect(browser)
        start_episode(browser, "calculator")
        call(browser, "calculator", a="40", b="2")
        assert browser.find(".call-entry .blocks").text == "42"
        browser.wait(lambda _: browser.find_all("#live-rows tr[data-environment=arithmetic]"), "the live view")
        browser.assert_clean()


def test_docs_renders_swagger_ui_offline(browser: Browser) -> None:
    browser.open("/docs")
    browser.wait(lambda _: len(browser.find_all(".opblock")) >= len(OPERATIONS), "Swagger UI's operations")
    assert len(browser.find_all(".opblock")) == len(OPERATIONS)
    assert "Open Reward Standard (ORS) HTTP API" in browser.text(".info .title")
    browser.assert_clean()


def test_a_pasted_task_spec_and_its_snippets(browser: Browser, server: ServeProcess) -> None:
    connect(browser)
    browser.find("#source-spec").click()
    browser.find("#task-spec").send_keys('{"id": 9, "question": "What is 2 + 2?", "answer": 4}')
    start_episode(browser, "submit")
    browser.wait_for_text("#prompt", "What is 2 + 2?")
    call(browser, "submit", answer="4")
    assert browser.text("#total-reward") == "1.0"

    snippets = {}
    for kind in ("Python (ors.client)", "Python (ors_grpc.client)"):
        Select(browser.find("#snippet-kind")).select_by_visible_text(kind)
        snippets[kind] = browser.text("#snippet")
    # The gRPC client's snippet names the default gRPC port: point it at this server's.
    assert server.grpc_target is not None
    snippets["Python (ors_grpc.client)"] = snippets["Python (ors_grpc.client)"].replace(
        '"127.0.0.1:50051"', f'"{server.grpc_target}"')
    for kind, program in snippets.items():
        assert '"question": "What is 2 + 2?"' in program, kind
        run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert run.returncode == 0, (kind, run.stderr)
        assert run.stdout.strip().endswith("1.0 True"), (kind, run.stdout)
    browser.assert_clean()
