"""The viewer in a real browser (Debian's Chromium through Playwright): pages, timeline, filters, XSS, live."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmtap import CaptureStore
from tests.fixtures import fixture
from tests.view.browser import CHROMIUM, chromium_page, viewer_serving
from tests.view.stores import T0, capture_line

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (scripts/bootstrap.sh installs it)"
    ),
]

# The timeline's colours (view.css), as the browser computes them.
OUTCOME_COLOURS = {
    "ok": "rgb(46, 155, 95)",
    "error": "rgb(208, 70, 60)",
    "truncated": "rgb(227, 155, 38)",
    "cancelled": "rgb(154, 161, 173)",
}
# Set to a directory (docs/images) to refresh the README's screenshots from this run.
SCREENSHOTS_ENV = "LLMTAP_VIEW_SCREENSHOTS"


@pytest.fixture
def served(capture_dir: tuple[Path, dict[str, list[str]]]) -> Iterator[tuple[str, Path, dict[str, list[str]]]]:
    root, outcomes = capture_dir
    with viewer_serving([root]) as url:
        yield url, root, outcomes


@pytest.fixture
def page() -> Iterator[Any]:
    with chromium_page() as browser_page:
        problems: list[str] = []
        browser_page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
        browser_page.on("pageerror", lambda error: problems.append(str(error)))
        browser_page.problems = problems
        yield browser_page


def _shoot(page: Any, tmp_path: Path, name: str) -> None:
    """Save a screenshot as a test artifact (and into $LLMTAP_VIEW_SCREENSHOTS when set)."""
    target = tmp_path / f"{name}.png"
    page.screenshot(path=str(target), full_page=False)
    if os.environ.get(SCREENSHOTS_ENV):
        shutil.copyfile(target, Path(os.environ[SCREENSHOTS_ENV]) / f"viewer-{name}.png")


def test_home_rollout_and_call_pages_render_without_errors(
    served: tuple[str, Path, dict[str, list[str]]], page: Any, tmp_path: Path
) -> None:
    url, _, outcomes = served
    page.goto(url + "/")
    assert page.locator("table.rollouts tbody tr").count() == len(outcomes)
    _shoot(page, tmp_path, "home")
    page.click("text=1-0")
    page.wait_for_url("**/s/d1/r/1-0")
    assert page.locator("svg.timeline g.bar").count() == 2
    _shoot(page, tmp_path, "rollout")
    page.click("#calls a >> text=0")
    page.wait_for_url("**/s/d1/r/1-0/c/0")
    assert page.locator(".msg.role-user").first.inner_text().endswith("What's the weather in Florence,Italy?")
    _shoot(page, tmp_path, "call")
    page.keyboard.press("j")
    page.wait_for_url("**/s/d1/r/1-0/c/1")
    page.keyboard.press("k")
    page.wait_for_url("**/s/d1/r/1-0/c/0")
    assert page.problems == []


def test_the_timeline_has_one_bar_per_call_in_time_order_with_its_outcome_colour(
    served: tuple[str, Path, dict[str, list[str]]], page: Any
) -> None:
    url, _, outcomes = served
    for rollout_id, expected in outcomes.items():
        page.goto(f"{url}/s/d1/r/{rollout_id}")
        bars = page.eval_on_selector_all(
            "svg.timeline g.bar",
            "bars => bars.map(g => { const r = g.querySelector('rect'); return "
            "[g.dataset.outcome, getComputedStyle(r).fill, r.getBBox().x, r.getBBox().width]; })",
        )
        assert [outcome for outcome, *_ in bars] == expected, rollout_id
        assert [fill for _, fill, *_ in bars] == [OUTCOME_COLOURS[o] for o in expected], rollout_id
        starts = [x for _, _, x, _ in bars]
        assert starts == sorted(starts), rollout_id
    assert page.problems == []


def test_filters_and_sorting_in_the_page_give_the_right_rows(
    served: tuple[str, Path, dict[str, list[str]]], page: Any
) -> None:
    url, _, _ = served

    def shown() -> list[str]:
        return page.eval_on_selector_all("table.rollouts tbody tr", "rows => rows.map(r => r.dataset.id)")

    page.goto(url + "/")
    page.select_option("select[name=status]", "error")
    page.click("button[type=submit]")
    page.wait_for_url("**status=error**")
    assert shown() == ["2-0", "3-0", "4-0"]
    page.select_option("select[name=status]", "")
    page.fill("input[name=q]", "-0")
    page.click("button[type=submit]")
    page.click("th >> text=in")
    page.wait_for_url("**sort=tokens_in**")
    assert shown()[:2] == ["1-0", "0-0"]  # numbers sort largest first on the first click
    page.click("th >> text=in")
    page.wait_for_url(lambda address: "sort=tokens_in" in address and "order=desc" not in address)
    assert shown()[0] == "2-0"
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    page.wait_for_url("**/s/d1/r/2-0")
    assert page.problems == []


def test_xss_payloads_from_a_crafted_capture_are_inert(
    served: tuple[str, Path, dict[str, list[str]]], page: Any
) -> None:
    url, _, _ = served
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    for path in ("/", "/s/d1/r/xss-0", "/s/d1/r/xss-0/c/0"):
        page.goto(url + path)
        for summary in page.locator("details > summary").all():
            summary.click()  # render the collapsed tool definitions and raw JSON too
        page.wait_for_timeout(200)
        assert page.evaluate("typeof window.__xss") == "undefined", path
    text = page.locator(".msg.role-user").inner_text()
    assert "<script>window.__xss = 1;" in text and 'href="javascript:' in text  # shown as text
    assert page.locator("main a[href^='javascript:']").count() == 0
    assert dialogs == []


def test_a_call_appended_while_the_page_is_open_appears_without_a_reload(
    served: tuple[str, Path, dict[str, list[str]]], page: Any
) -> None:
    url, root, _ = served
    page.goto(url + "/s/d1/r/0-0")
    page.evaluate("window.__not_reloaded = true")
    page.wait_for_selector("#live-state:not([hidden])")
    assert page.locator("svg.timeline g.bar").count() == 2
    with CaptureStore(root) as store:
        store.append("0-0", capture_line(fixture("chat/error-401-invalid-api-key"), started_at=T0 + 4, latency_ms=80.0))
    # A function, not an expression string: the page's CSP refuses eval, even Playwright's.
    page.wait_for_function("() => document.querySelectorAll('svg.timeline g.bar').length === 3", timeout=10_000)
    assert page.evaluate("window.__not_reloaded") is True
    assert page.locator("svg.timeline g.bar").nth(2).get_attribute("data-outcome") == "error"
    page.goto(url + "/")
    page.evaluate("window.__not_reloaded = true")
    page.wait_for_selector("#live-state:not([hidden])")
    with CaptureStore(root) as store:
        store.append("10-0", capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0 + 600, latency_ms=80.0))
    started = time.monotonic()
    page.wait_for_function(
        "() => document.querySelector('tr[data-id=\"10-0\"] td:nth-child(3)').textContent.trim().startsWith('2')",
        timeout=15_000,
    )
    assert page.evaluate("window.__not_reloaded") is True and time.monotonic() - started < 15
    assert page.problems == []


def test_screenshots_of_a_small_training_run(tmp_path: Path, page: Any) -> None:
    """The README's screenshots: a rollouts file with its capture directory, as an RL engineer opens it."""
    from tests.view.stores import build_training_store

    build_training_store(tmp_path / "calls", tmp_path / "rollouts.jsonl")
    with viewer_serving([tmp_path / "rollouts.jsonl", tmp_path / "calls"]) as url:
        page.goto(url + "/s/f1?per_page=25")
        assert page.locator("table.rollouts tbody tr").count() == 25
        _shoot(page, tmp_path, "home")
        page.goto(url + "/s/f1/r/2-1")
        assert page.locator("svg.timeline g.bar").count() >= 2
        _shoot(page, tmp_path, "rollout")
        page.goto(url + "/s/f1/r/2-1/c/6")  # the answer after the tool loop: the whole conversation
        _shoot(page, tmp_path, "call")
    assert page.problems == []


# The compare page's row colours (view.css), as the browser computes them.
COMPARE_COLOURS = {
    "unchanged": "rgba(0, 0, 0, 0)",
    "changed": "rgb(255, 244, 220)",
    "added": "rgb(228, 246, 234)",
    "removed": "rgb(253, 230, 227)",
}


def test_the_compare_page_pairs_calls_side_by_side_with_their_status_colours(tmp_path: Path, page: Any) -> None:
    from llmtap.view import ViewerSettings, create_app
    from llmtap.view.sources import discover_pair
    from tests.support.servers import ServerThread, free_port
    from tests.view.compare_stores import EDITED_ROLLOUT, EDITED_STATUSES, build_compare_runs

    run_a, run_b = build_compare_runs(tmp_path / "a", tmp_path / "b")
    sources, sid_a, sid_b = discover_pair(str(run_a), str(run_b))
    port = free_port()
    app = create_app(sources, ViewerSettings(port=port, poll_seconds=0.2, compare=(sid_a, sid_b)))
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    with ServerThread(app, port=port, lifespan="on", graceful_timeout=1).start() as server:
        page.goto(server.base_url + "/")  # opens on the comparison; the summary arrives without a reload
        page.wait_for_selector("#totals", timeout=15_000)
        rows = page.eval_on_selector_all(
            "#compare-rollouts tbody tr", "rows => rows.map(r => [r.dataset.key, r.querySelector('.pill').textContent])"
        )
        assert rows == [["1-0", "changed"], ["4-0", "removed"], ["5-0", "added"], ["xss-0", "changed"]]
        page.click(f"#compare-rollouts a >> text={EDITED_ROLLOUT}")
        page.wait_for_url(f"**/compare/{sid_a}/{sid_b}/r/{EDITED_ROLLOUT}")
        assert page.locator("tr.pair:visible").count() == 3  # unchanged calls start collapsed
        for toggle in page.locator(".fold-toggle").all():
            toggle.click()  # open the collapsed unchanged calls
        pairs = page.eval_on_selector_all(
            "tr.pair",
            "rows => rows.map(r => [r.dataset.status, getComputedStyle(r).backgroundColor, r.offsetParent !== null])",
        )
        assert [status for status, _, _ in pairs] == EDITED_STATUSES
        assert [colour for _, colour, _ in pairs] == [COMPARE_COLOURS[status] for status in EDITED_STATUSES]
        assert all(visible for _, _, visible in pairs)
        assert page.locator("pre.textdiff .add").first.inner_text() == "+Olá 1!"
        page.locator(".fold-toggle").nth(1).click()
        page.locator(".fold-toggle").nth(2).click()  # the screenshot: the first run of unchanged calls open
        _shoot(page, tmp_path, "compare")
        page.click(f"tr.st-removed a[href='/s/{sid_a}/r/{EDITED_ROLLOUT}/c/3']")
        page.wait_for_url(f"**/s/{sid_a}/r/{EDITED_ROLLOUT}/c/3")
        page.go_back()
        page.goto(f"{server.base_url}/compare/{sid_a}/{sid_b}/r/xss-0")
        assert page.evaluate("typeof window.__xss") == "undefined"
    assert dialogs == [] and page.problems == []
