"""`treemail ui` in a real browser: Debian's chromium, headless, driven through chromedriver (selenium).

The stack is the demo's (`treemail demo`, its Valkey, workers and projection worker), the page is a real
`treemail ui` process, and what the page shows is checked against what the streams say. `make test`
installs chromium and chromium-driver when run as root and online; without them this test skips, saying
why. With TREEMAIL_UPDATE_SCREENSHOT=1 (`make screenshot`) it saves the page as the docs' screenshot.
"""

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from treemail.adapters.config import load_config
from treemail.host import SendContext, Treemail
from treemail.projections import timeline as tl

ROOT = Path(__file__).resolve().parents[2]
# Written by `make chromium` when it could not install the packages.
SKIP_REASON_FILE = ROOT / ".venv" / "chromium-unavailable"
SCREENSHOT = ROOT / "docs" / "images" / "timeline-ui.png"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1500,1100")


def binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if found is None:
        why = SKIP_REASON_FILE.read_text().strip() if SKIP_REASON_FILE.exists() else (
            "install Debian's chromium and chromium-driver (`make chromium` as root)")
        pytest.skip(f"{name} not found: {why}")
    return found


def start(args: list[str], env: dict, until: str, timeout: float = 90.0) -> tuple[subprocess.Popen, str]:
    """A treemail process, and its output up to the line that says it is ready."""
    process = subprocess.Popen([sys.executable, "-m", "treemail", *args], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out, deadline = "", time.monotonic() + timeout
    while until not in out:
        line = process.stdout.readline()
        if not line or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"`treemail {' '.join(args)}` did not say {until!r}:\n{out}{line}")
        out += line
    return process, out


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def demo_page():
    """The demo's stack left running, a `treemail ui` over it, and the demo's transcript."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "TREEMAIL_UI_TOKEN")}
    demo, transcript = start(["demo"], env, "stack is up")
    try:
        url = re.search(r"REDIS_URL=(\S+)", transcript).group(1)
        ui, said = start(["ui", "--port", "0"], {**env, "REDIS_URL": url}, "treemail ui at")
        try:
            page = re.search(r"(http://127\.0\.0\.1:\d+/)", said).group(1)
            yield url, page, transcript
        finally:
            stop(ui)
    finally:
        stop(demo)


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary("chromium")
    # The browser's profile (a few MB) goes with the test.
    profile = tempfile.TemporaryDirectory(prefix="treemail-chromium-", ignore_cleanup_errors=True)
    for flag in (*FLAGS, f"--user-data-dir={profile.name}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(binary("chromedriver")), options=options)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        profile.cleanup()


def wait(driver, check, what: str, timeout: float = 20.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: check(d), message=what)


# The page re-renders whenever the stack appends an event: it is read and clicked in one script each time,
# never through an element found earlier (stale by the next event).
SHOWN = """
const out = {};
for (const column of document.querySelectorAll('#mailbox .column')) {
  out[column.dataset.state] = [...column.querySelectorAll('.msg')].map((m) => m.dataset.messageId);
}
return out;
"""


# Holds the answers to the page's live timeline loads (no `?at=`), each read whole before it is held so that a
# release hands it over at once; `releaseHeldAnswers()` hands over those held and stops holding.
HOLD_LIVE_TIMELINE_ANSWERS = """
const realFetch = window.fetch;
window.heldAnswers = [];
let holding = true;
window.releaseHeldAnswers = () => { holding = false; window.heldAnswers.splice(0).forEach((hand) => hand()); };
window.fetch = async (url, options) => {
  const response = await realFetch(url, options);
  if (!holding || !/\\/timeline$/.test(url)) return response;
  await response.clone().text();
  return new Promise((resolve) => window.heldAnswers.push(() => resolve(response)));
};
"""


# Holds the answers to the loads of one message's chain (arguments[0]: its id) until `releaseHeldChain()`.
HOLD_ONE_MESSAGES_CHAIN = """
const realFetch = window.fetch, held = arguments[0];
window.heldChain = [];
window.releaseHeldChain = () => { window.fetch = realFetch; window.heldChain.splice(0).forEach((hand) => hand()); };
window.fetch = async (url, options) => {
  const response = await realFetch(url, options);
  if (!url.endsWith('/messages/' + held)) return response;
  await response.clone().text();
  return new Promise((resolve) => window.heldChain.push(() => resolve(response)));
};
"""


def shown(driver) -> dict[str, list[str]]:
    return driver.execute_script(SHOWN)


def column(driver, state: str) -> list[str]:
    return shown(driver).get(state, [])


def text(driver, element_id: str) -> str:
    return driver.execute_script("return document.getElementById(arguments[0]).innerText", element_id)


def click(driver, selector: str) -> None:
    driver.execute_script("document.querySelector(arguments[0]).click()", selector)


def session_node(driver, handle: str) -> dict | None:
    """The tree node of a handle: its session id and the handle of the node it is nested under."""
    return driver.execute_script("""
        const node = [...document.querySelectorAll('[data-session-id]')].find((n) => n.textContent.startsWith(arguments[0]));
        if (!node) return null;
        const parent = node.closest('ul').closest('li');
        const above = parent ? parent.querySelector(':scope > [data-session-id]') : null;
        return {id: node.dataset.sessionId, under: above ? above.textContent.split(' ')[0] : null};
    """, handle)


def expected(found: tl.Timeline) -> dict[str, list[str]]:
    mailbox = found.to_json()["mailbox"]
    return {**{s: mailbox[s] for s in ("pending", "claimed", "consumed", "parked")},
            "returned": mailbox["returned"] + mailbox["discarded"]}


async def with_host(url: str, action, threads: bool = False):
    config = load_config(None)
    config = config.model_copy(update={"service": config.service.model_copy(update={"redis_url": url}),
                                       "messaging": config.messaging.model_copy(update={"threads": threads})})
    host = await Treemail.connect(config, url)
    try:
        return await action(host)
    finally:
        await host.close()


def sessions_in(trees: list[dict]) -> int:
    return sum(1 + sessions_in(node["children"]) for node in trees)


def address(driver) -> str:
    return driver.execute_script("return location.pathname + location.search")


def test_the_page_shows_the_demo_tree_scrubs_a_mailbox_back_and_follows_a_live_send(demo_page, browser, tmp_path):
    url, page, transcript = demo_page
    planner = re.search(r"tail (planner_[0-9a-f]{8})", transcript).group(1)
    explore = re.search(r"history (explore_[0-9a-f]{8})", transcript).group(1)

    browser.get(page)
    # The position slider shows only once a session is chosen: its own display rule once overrode `hidden`.
    assert browser.execute_script("const s = document.getElementById('scrub'); const was = s.hidden; s.hidden = true;"
                                  "const shown = getComputedStyle(s).display; s.hidden = was; return shown") == "none"
    # The demo's tree: the explorer nested under its planner.
    wait(browser, lambda d: (session_node(d, explore) or {}).get("under") == planner, "the explorer under its planner")
    # The writer's request waits for a person: its body is clipped in the list, and the whole of it is a click
    # away (an operator approves only what it could read whole).
    request = wait(browser, lambda d: d.execute_script("""
        const details = document.querySelector('#approvals li details.clipped');
        return details && {summary: details.querySelector('summary').innerText, shut: details.innerText};"""),
        "the waiting request, clipped")
    whole = "May I publish the release note? It lists the three fixes and thanks the two new contributors by name."
    assert request["summary"] == whole[:60] + "…" and whole not in request["shut"]
    click(browser, "#approvals li details.clipped summary")
    assert whole in wait(browser, lambda d: d.execute_script(
        "const d = document.querySelector('#approvals li details.clipped'); return d && d.open && d.innerText"),
        "the whole request, opened")
    browser.execute_script("return loadTrees()")  # drawn again, as every event draws it: still open
    assert browser.execute_script("return document.querySelector('#approvals li details.clipped').open")
    explore_id = session_node(browser, explore)["id"]
    click(browser, f'[data-session-id="{explore_id}"]')
    wait(browser, lambda d: text(d, "session-title") == explore, "the explorer's mailbox")

    # The stack may still be appending (the demo's last steps, a pump pass): each look compares the page with
    # the streams as they are at that moment, and the last look's streams are the ones the rest reads.
    latest: dict = {}

    def matches_the_streams(driver) -> bool:
        latest["history"] = asyncio.run(with_host(url, lambda host: host.history(explore_id)))
        latest["now"] = tl.timeline(explore_id, {explore_id: latest["history"]})
        return shown(driver) == expected(latest["now"])

    wait(browser, matches_the_streams, "the mailbox now, as the streams say", timeout=60)
    history, now = latest["history"], latest["now"]
    # An earlier position: just after the planner's queued follow-up was accepted, before any run took it.
    follow_up = next(m for m in now.messages if m.body.startswith("When you are done"))
    assert follow_up.state == "consumed"
    earlier = follow_up.position
    then = tl.timeline(explore_id, {explore_id: history}, earlier)
    # The steps the host did not number carry a `*`, and a legend says what it means.
    assert any(not s.reported for r in now.runs for s in r.steps)
    wait(browser, lambda d: d.execute_script("return !document.getElementById('steps-legend').hidden"), "the legend")
    assert "* the host did not report this step" in text(browser, "steps-legend")

    # A deep link to that position loads it directly, in a fresh page.
    browser.get(f"{page}s/{explore_id}?at={earlier}")
    wait(browser, lambda d: d.execute_script("return document.getElementById('position').dataset.at") == str(earlier),
         "the deep link's position")
    wait(browser, lambda d: shown(d) == expected(then), "the deep link's mailbox, as the streams say")
    assert text(browser, "session-title") == explore and address(browser) == f"/s/{explore_id}?at={earlier}"
    # Handles are one word: a narrow column cuts a card's handle short, never breaks it over two lines.
    browser.set_window_size(900, 1100)
    broken = browser.execute_script("return [...document.querySelectorAll('#mailbox .msg .from')]"
                                    ".filter((h) => h.getClientRects().length > 1).map((h) => h.textContent)")
    browser.set_window_size(1500, 1100)
    assert broken == []
    click(browser, "#follow")
    wait(browser, lambda d: address(d) == f"/s/{explore_id}", "the address follows live too")

    # A live refresh is in flight when the reader scrubs, and its answer (the mailbox now) arrives within the
    # scrub's pause, before the scrub's own load: the page must still go to the position the reader picked.
    browser.execute_script(HOLD_LIVE_TIMELINE_ANSWERS)
    browser.execute_script("refresh()")
    wait(browser, lambda d: d.execute_script("return window.heldAnswers.length") > 0, "a live refresh in flight")
    browser.execute_script(
        "const s = document.getElementById('scrubber'); s.value = arguments[0];"
        "s.dispatchEvent(new Event('input', {bubbles: true}));"
        "window.releaseHeldAnswers();", earlier)
    wait(browser, lambda d: d.execute_script("return document.getElementById('position').dataset.at") == str(earlier),
         "the scrubber moved back")
    wait(browser, lambda d: shown(d) == expected(then), "the mailbox then, as the streams say")
    assert follow_up.message_id in column(browser, "pending")
    assert follow_up.message_id not in column(browser, "consumed")
    assert f"position {earlier} of {now.last}" in text(browser, "position")
    assert address(browser) == f"/s/{explore_id}?at={earlier}"  # the address is a link to what is shown

    # Live: back to following, then a send from a new helper's run lands while the page is open (no reload).
    click(browser, "#follow")
    wait(browser, lambda d: shown(d) == expected(now), "following live again")

    async def live_send(host):
        helper = await host.register_child(explore_id, "helper", "runs the tests", rules={"parent": "allow"},
                                           status="running")
        await host.start_run(helper.session_id, "run-helper-1")
        result = await host.send(helper.session_id, explore, "live: the patch passes its tests")
        return helper, result

    helper, result = asyncio.run(with_host(url, live_send))
    assert "message_id" in result, result
    sent = result["message_id"]
    wait(browser, lambda d: sent in column(d, "pending") + column(d, "claimed"), "the live send on the page")
    wait(browser, lambda d: (session_node(d, helper.handle) or {}).get("under") == explore, "the helper in the tree")
    assert int(browser.execute_script("return document.getElementById('scrubber').max")) > now.last

    # The message's lifecycle and causal chain.
    click(browser, f'.msg[data-message-id="{sent}"]')
    wait(browser, lambda d: "sent by run run-helper-1" in text(d, "message"), "the chain")
    kinds = browser.execute_script("return [...document.querySelectorAll('#lifecycle tr[data-kind]')]"
                                   ".map((r) => r.dataset.kind)")
    assert kinds[0] == "accepted"
    assert address(browser) == f"/m/{sent}"
    # The message's link, opened in a fresh page: its mailbox, with the message shown.
    browser.get(f"{page}m/{sent}")
    wait(browser, lambda d: "sent by run run-helper-1" in text(d, "message"), "the message link's chain")
    wait(browser, lambda d: text(d, "session-title") == explore and sent in column(d, "pending") + column(d, "claimed"),
         "the message link's mailbox")

    # A causal chain across sessions: the reviewer asked for the patch after it read the planner's introduction.
    # A live redraw's load of the message shown before is still in flight when the reader opens this one, and
    # answers after it: the page must stay on the message the reader opened.
    browser.execute_script(HOLD_ONE_MESSAGES_CHAIN, sent)
    browser.execute_script("showMessage(arguments[0], false)", sent)
    wait(browser, lambda d: d.execute_script("return window.heldChain.length") > 0, "a redraw's load in flight")
    ask = next(m for m in now.messages if m.body.startswith("Send me the patch"))
    click(browser, f'.msg[data-message-id="{ask.message_id}"]')
    wait(browser, lambda d: "has a patch for you to review" in text(d, "message"), "the cause in another mailbox")
    browser.execute_script("window.releaseHeldChain()")
    browser.execute_script("return new Promise((done) => setTimeout(done, 300))")  # the late answer is handled
    assert "has a patch for you to review" in text(browser, "message")
    assert f"sent by run {ask.lifecycle[0].run_id}" in text(browser, "message")

    browser.execute_script("window.scrollTo(0, 0)")
    target = SCREENSHOT if os.environ.get("TREEMAIL_UPDATE_SCREENSHOT") else tmp_path / "ui.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(target))
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A conversation as a thread: two new helpers, a question and the answer naming it, on the answerer's page.
    async def converse(host):
        asker, answerer = [await host.register_child(explore_id, kind, kind, rules={"sibling": "allow"},
                                                     status="running") for kind in ("asker", "answerer")]
        await host.start_run(asker.session_id, "run-ask")
        await host.start_run(answerer.session_id, "run-answer")
        ask = await host.send_message(SendContext(asker.session_id, "run-ask", "q-1"),
                                      {"to": answerer.handle, "body": "which tests fail?"})
        answer = await host.send_message(SendContext(answerer.session_id, "run-answer", "a-1"),
                                         {"to": asker.handle, "body": "test_cache", "in_reply_to": ask["message_id"]})
        return answerer, ask["message_id"], answer["message_id"]

    answerer, ask_id, answer_id = asyncio.run(with_host(url, converse, threads=True))
    wait(browser, lambda d: session_node(d, answerer.handle) is not None, "the answerer in the tree")
    click(browser, f'[data-session-id="{answerer.session_id}"]')
    posts = "return [...document.querySelectorAll('#threads .post')].map((p) => [p.dataset.messageId, p.dataset.depth])"
    wait(browser, lambda d: d.execute_script(posts) == [[ask_id, "0"], [answer_id, "1"]],
         "the question and, under it, the answer sent back")
    assert f"thread {ask_id[-8:]} (2 messages)" in text(browser, "threads")

    # A causal chain cut at its bound says how many causes it did not follow: a run that consumed 70 notes,
    # then sent one message.
    async def fan_in(host):
        reader = await host.register_child(explore_id, "reader", "reads notes", rules={"parent": "allow"},
                                           status="running")
        notes = [await host.inject(reader.session_id, "plugin", f"note {n}") for n in range(70)]
        await host.start_run(reader.session_id, "run-read")
        while claimed := await host.claim(reader.session_id, "run-read"):
            for delivery in claimed:
                await host.consume(reader.session_id, delivery.message_id)
        sent = await host.send_message(SendContext(reader.session_id, "run-read", "s-1"),
                                       {"to": explore, "body": "read them all"})
        return len(notes), sent["message_id"]

    notes, summary = asyncio.run(with_host(url, fan_in))
    browser.get(f"{page}m/{summary}")
    wait(browser, lambda d: d.execute_script("return document.getElementById('chain-cut')"), "the cut chain's line")
    assert text(browser, "chain-cut") == f"{notes - 63} earlier causes not followed: a chain stops at 64 messages"

    # A page that lists fewer sessions than there are says how many older ones it leaves out.
    with urllib.request.urlopen(f"{page}api/trees", timeout=20) as answer:  # the sessions there are, all listed
        whole = json.loads(answer.read())
    listed = sessions_in(whole["trees"])
    assert whole["not_listed"] == 0 and listed > 2
    assert not browser.execute_script("return document.getElementById('not-listed')")
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "TREEMAIL_UI_TOKEN")}
    short_page, said = start(["ui", "--port", "0", "--sessions", "2"], {**env, "REDIS_URL": url}, "treemail ui at")
    try:
        browser.get(re.search(r"(http://127\.0\.0\.1:\d+/)", said).group(1))
        wait(browser, lambda d: d.execute_script("return document.getElementById('not-listed')"), "the note")
        note = text(browser, "not-listed")
        assert browser.execute_script("return document.querySelectorAll('#trees [data-session-id]').length") == 2
    finally:
        stop(short_page)
    assert note == f"{listed - 2} older sessions not listed: the page lists the newest 2 (treemail ui --sessions lists more)"


def test_write_actions_need_the_operators_token_and_the_page_answers_only_loopback_names(demo_page):
    url, read_only, transcript = demo_page
    approval = re.search(r"approvals approve (\S+)", transcript).group(1)

    def call(page: str, path: str, token: str | None = None, method: str = "POST", host: str | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if host:
            headers["Host"] = host
        request = urllib.request.Request(page + path, method=method, data=b"" if method == "POST" else None,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    status, body = call(read_only, f"api/approvals/{approval}/approve")
    assert status == 403 and json.loads(body)["error"]["code"] == "ui:read_only"
    assert call(read_only, "api/trees", method="GET")[1]["writable"] is False
    assert call(read_only, "api/trees", method="GET", host="attacker.example")[0] == 400

    env = {**{k: v for k, v in os.environ.items()}, "REDIS_URL": url, "TREEMAIL_UI_TOKEN": "s3cret-operator"}
    ui, said = start(["ui", "--port", "0"], env, "treemail ui at")
    try:
        page = re.search(r"(http://127\.0\.0\.1:\d+/)", said).group(1)
        status, body = call(page, f"api/approvals/{approval}/approve", token="wrong")
        assert status == 401 and json.loads(body)["error"]["code"] == "ui:unauthorized"
        waiting = [a["request_id"] for a in call(page, "api/trees", method="GET")[1]["approvals"]]
        assert approval in waiting  # the refused call changed nothing
        status, body = call(page, f"api/approvals/{approval}/approve", token="s3cret-operator")
        assert status == 200 and body["request_id"] == approval
        assert approval not in [a["request_id"] for a in call(page, "api/trees", method="GET")[1]["approvals"]]
        # A refusal keeps the host API's own code, with the status the gateway gives it; a route or method the
        # page does not have, and an id it cannot find, are answered in the same shape, the id in part.
        for path, method, expected in (
                (f"api/approvals/{approval}/approve", "POST", (409, "approval:already_decided")),
                ("api/approvals/no-such-request/deny", "POST", (404, "approval:unknown_request")),
                ("api/messages/no-such-message/retry", "POST", (404, "message:unknown")),
                (f"api/messages/{'m' * 300}/retry", "POST", (400, "identifier:too_long")),
                ("api/nothing-here", "GET", (404, "ui:not_found")),
                ("api/messages/m/retry", "GET", (405, "ui:method_not_allowed")),
                (f"s/{'x' * 5000}", "GET", (404, "ui:unknown_session"))):
            status, body = call(page, path, token="s3cret-operator", method=method)
            error = json.loads(body)["error"]
            assert (status, error["code"]) == expected and len(error["message"]) < 400, (path, status, error)
    finally:
        stop(ui)
