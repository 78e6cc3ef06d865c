"""The compare pages as a browser sees them: two runs' summary and gate, one rollout's calls side by side."""

from __future__ import annotations

import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from llmtap.capsule.ulid import new_ulid
from llmtap.cli.view import view
from llmtap.diff.comparison import compare_runs
from llmtap.diff.gate import GateOptions, evaluate_gate
from llmtap.diff.render import to_json
from llmtap.diff.sources import open_source
from llmtap.view import ViewerSettings, create_app
from llmtap.view.compare import BLOCKS_PER_PAGE, UNCHANGED_SHOWN
from llmtap.view.guard import CONTENT_SECURITY_POLICY
from llmtap.view.sources import discover, discover_pair, is_comparison
from tests.view.compare_stores import EDITED_ROLLOUT, EDITED_STATUSES, build_compare_runs, build_long_rollout, question
from tests.view.conftest import PORT
from tests.view.stores import XSS_TEXT, XSS_TOOL, build_store


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the text of each element with a `data-status` or `data-key`."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


def _elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Elements()
    parser.feed(html)
    return parser.found


def _pairs(html: str) -> list[str]:
    """The status of each side-by-side row in page order (folded unchanged rows included)."""
    return [attrs["data-status"] or "" for tag, attrs in _elements(html) if tag == "tr" and "data-status" in attrs]


def _client(sources: object, compare: tuple[str, str] | None) -> TestClient:
    app = create_app(sources, ViewerSettings(port=PORT, background=False, compare=compare))  # type: ignore[arg-type]
    return TestClient(app, base_url=f"http://127.0.0.1:{PORT}")


def _summarised(client: TestClient, url: str) -> str:
    """The compare page once its run summary (computed in the background) is there."""
    for _ in range(400):
        response = client.get(url)
        assert response.status_code == 200
        if 'id="totals"' in response.text:
            return response.text
        time.sleep(0.05)
    raise AssertionError("the run summary was never computed")


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return build_compare_runs(tmp_path / "a", tmp_path / "b")


@pytest.fixture
def client(runs: tuple[Path, Path]) -> TestClient:
    sources, sid_a, sid_b = discover_pair(str(runs[0]), str(runs[1]))
    assert (sid_a, sid_b) == ("d1", "d2")
    with _client(sources, (sid_a, sid_b)) as client:
        yield client


def test_the_home_page_opens_on_the_comparison(client: TestClient) -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 307 and response.headers["location"] == "/compare/d1/d2"


def test_the_summary_lists_each_rollouts_status_the_totals_and_the_gates_regressions(
    client: TestClient, runs: tuple[Path, Path]
) -> None:
    html = _summarised(client, "/compare/d1/d2?status=all")
    rows = {attrs["data-key"]: attrs["class"] for tag, attrs in _elements(html) if tag == "tr" and "data-key" in attrs}
    assert rows == {
        "0-0": "st-unchanged", "1-0": "st-changed", "4-0": "st-removed", "5-0": "st-added", "xss-0": "st-changed",
    }  # fmt: skip
    with open_source(str(runs[0])) as a, open_source(str(runs[1])) as b:
        comparison = compare_runs(a, b)
    expected = to_json(comparison, evaluate_gate(comparison, GateOptions()))
    totals = dict(re.findall(r"<tr><th>([a-zA-Z0-9 ]+)</th>\s*<td class=\"n\">([^<]*)</td>", html))
    assert totals["calls"] == str(expected["summary"]["a"]["calls"]) and totals["tokens in"] == "242"
    codes = re.findall(r'<li><span class="pill bad">(\w+)</span>', html)
    assert sorted(codes) == sorted(reason["code"] for reason in expected["gate"]["reasons"])
    assert sorted(codes) == ["call_added", "call_added", "call_removed", "call_removed"]
    assert 'href="/compare/d1/d2/r/1-0">rollout &#39;1-0&#39;: call 3 of run A has no counterpart' in html
    # By default only the rollouts that differ are listed; the gate's options change its verdict.
    default = client.get("/compare/d1/d2").text
    assert 'data-key="0-0"' not in default and 'data-key="1-0"' in default
    allowed = client.get("/compare/d1/d2?allow_added=1").text
    assert re.findall(r'<li><span class="pill bad">(\w+)</span>', allowed) == ["call_removed", "call_removed"]
    noted = client.get("/compare/d1/d2?max_token_increase=lots").text
    assert "&#39;lots&#39; is not a threshold" in noted


def test_a_rollouts_calls_pair_side_by_side_as_llmtap_diff_aligns_them(client: TestClient) -> None:
    response = client.get(f"/compare/d1/d2/r/{EDITED_ROLLOUT}")
    assert response.status_code == 200
    html = response.text
    assert _pairs(html) == EDITED_STATUSES
    assert html.count('class="fold"') == 3  # the three runs of unchanged calls collapse
    # The edited call names what changed: the sampling part, the answer's text, the latency.
    assert '<span class="pill part">sampling</span>' in html and "/request/temperature" in html
    assert '<span class="del">-Oi 1!</span>' in html and '<span class="add">+Olá 1!</span>' in html
    assert "latency 100 ms → 180 ms" in html
    # Each side links to its own call page: the removed call in run A, the added one in run B.
    links = {attrs["href"] for tag, attrs in _elements(html) if tag == "a"}
    assert {"/s/d1/r/1-0/c/3", "/s/d2/r/1-0/c/2", "/s/d1/r/1-0", "/s/d2/r/1-0"} <= links
    assert client.get("/s/d1/r/1-0/c/3").status_code == 200 and client.get("/s/d2/r/1-0/c/2").status_code == 200


def test_rollouts_in_one_run_only_show_every_call_added_or_removed(client: TestClient) -> None:
    assert _pairs(client.get("/compare/d1/d2/r/4-0").text) == ["removed"]
    assert _pairs(client.get("/compare/d1/d2/r/5-0").text) == ["added"]


def test_crafted_payloads_show_as_text_on_every_compare_page(client: TestClient) -> None:
    pages = ["/compare/d1/d2/r/xss-0", "/compare/d1/d2/live"]
    _summarised(client, "/compare/d1/d2")
    for path in ["/compare/d1/d2", *pages]:
        response = client.get(path)
        assert response.status_code == 200
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        elements = _elements(response.text)
        scripts = [attrs for tag, attrs in elements if tag == "script"]
        assert scripts == ([] if path.endswith("/live") else [{"src": "/static/view.js", "defer": None}]), path
        assert not [attrs for _, attrs in elements if any(name.startswith("on") for name in attrs)], path
        assert not [tag for tag, _ in elements if tag in ("img", "svg", "iframe")], path
        assert "javascript:" not in " ".join(str(attrs.get("href")) for _, attrs in elements), path
    html = client.get("/compare/d1/d2/r/xss-0").text
    assert "&lt;script&gt;window.__xss = 1;" in html  # the prompt's excerpt, as text
    assert XSS_TOOL.replace('"', "&#34;").replace("<", "&lt;").replace(">", "&gt;") in html  # the tool's new name
    assert XSS_TEXT not in html


def test_a_long_rollout_pages_by_blocks_and_long_unchanged_runs_list_their_ends(tmp_path: Path) -> None:
    evens = range(0, 2 * BLOCKS_PER_PAGE + 40, 2)  # changed, each between two unchanged calls
    changed = {*evens, 2 * BLOCKS_PER_PAGE + 70}
    calls = 2 * BLOCKS_PER_PAGE + 100
    blocks = 2 * len(evens) - 1 + 3  # then a run of unchanged calls, one changed call, the unchanged tail
    build_long_rollout(tmp_path / "a", tmp_path / "b", calls=calls, changed=changed)
    sources, sid_a, sid_b = discover_pair(str(tmp_path / "a"), str(tmp_path / "b"))
    with _client(sources, (sid_a, sid_b)) as client:
        pages = [client.get(f"/compare/d1/d2/r/long-0?page={n}").text for n in (1, 2, 3)]
        statuses = [status for html in pages for status in _pairs(html)]
        assert statuses.count("changed") == len(changed)
        shown = [len(re.findall(r'<tbody class="(?:fold|change)"', html)) for html in pages]
        assert shown == [BLOCKS_PER_PAGE, BLOCKS_PER_PAGE, blocks - 2 * BLOCKS_PER_PAGE]
        assert "page 3 of 3" in pages[2] and "page 3 of 3" in client.get("/compare/d1/d2/r/long-0?page=999").text
        # The last 29 unchanged calls fold into one block listing its ends, the middle left out.
        last = pages[2]
        assert f"{calls - 2 * BLOCKS_PER_PAGE - 71} unchanged calls" in last
        assert f"… {calls - 2 * BLOCKS_PER_PAGE - 71 - 2 * UNCHANGED_SHOWN} more unchanged calls" in last


def test_two_runs_that_share_no_rollout_or_unknown_names_are_explained(tmp_path: Path) -> None:
    build_store(tmp_path / "a")
    from tests.view.compare_stores import _write

    _write(tmp_path / "b", {"other-0": [question(1, started=0.0)]})
    sources = discover([str(tmp_path / "a"), str(tmp_path / "b")])
    with _client(sources, None) as client:
        response = client.get("/compare/d1/d2")
        assert response.status_code == 400 and "share no rollout id" in response.text
        assert client.get("/compare/d1/nope").status_code == 404
        assert client.get("/compare?a=d1&b=zz").status_code == 404
    sources = discover([str(tmp_path / "a"), str(tmp_path / "a")])
    with _client(sources, None) as client:
        assert client.get("/compare/d1/d2/r/0-0").status_code == 200
        assert client.get("/compare/d1/d2/r/no-such-0").status_code == 404
        assert client.get("/compare/d1/d2/r/" + "x" * 600).status_code == 404


def test_the_home_page_offers_a_comparison_of_two_of_its_sources(runs: tuple[Path, Path], tmp_path: Path) -> None:
    build_store(tmp_path / "third")
    sources = discover([str(runs[0]), str(runs[1]), str(tmp_path / "third")])
    with _client(sources, None) as client:
        home = client.get("/")
        assert home.status_code == 200 and 'action="/compare"' in home.text
        chosen = client.get("/compare?a=d1&b=d2", follow_redirects=False)
        assert chosen.status_code == 303 and chosen.headers["location"] == "/compare/d1/d2"
        assert "d1" in _summarised(client, "/compare/d1/d2")


def test_two_paths_compare_unless_they_are_a_rollouts_file_with_its_capture_directory(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = str(runs[0]), str(runs[1])
    rows = tmp_path / "rollouts.jsonl"
    rows.write_text("")
    assert is_comparison([a, b])
    assert not is_comparison([a]) and not is_comparison([a, b, a])
    assert not is_comparison([str(rows), a]) and not is_comparison([a, str(rows)])
    runs_dir = tmp_path / "runs"
    capsule = runs_dir / new_ulid()
    capsule.mkdir(parents=True)
    (capsule / "capsule.json").write_text('{"status": "success"}')
    assert not is_comparison([str(runs_dir), a])  # a directory of runs is listed, not compared
    assert is_comparison([str(capsule), a])  # a capsule is one run
    sources, sid_a, sid_b = discover_pair(str(rows), a)
    assert (sid_a, sid_b) == ("f1", "d1") and sources.sources["f1"].captures is None  # not joined to run B


def test_the_cli_opens_on_the_compare_page_or_says_why_it_cannot(
    runs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[ViewerSettings] = []
    monkeypatch.setattr("llmtap.view.serve_app", lambda sources, settings: served.append(settings))
    runner = CliRunner()
    result = runner.invoke(view, [str(runs[0]), str(runs[1]), "--port", "8799"])
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:8799/compare/d1/d2" in result.output and served[-1].compare == ("d1", "d2")
    result = runner.invoke(view, [str(runs[0]), str(runs[1]), "--no-compare"])
    assert result.exit_code == 0 and served[-1].compare is None
    result = runner.invoke(view, [str(runs[0]), "--compare"])
    assert result.exit_code == 2 and "--compare compares two runs" in result.output
    build_store(tmp_path / "unrelated")
    from tests.view.compare_stores import _write

    _write(tmp_path / "other", {"other-0": [question(1, started=0.0)]})
    result = runner.invoke(view, [str(tmp_path / "unrelated"), str(tmp_path / "other")])
    assert result.exit_code == 1 and "cannot be compared" in result.output and "share no rollout id" in result.output


def test_a_rollouts_file_compares_with_a_capture_directory_when_asked(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """Collect/attach rows of run A (payloads kept) against run B's capture directory: the same alignment."""
    from llmtap import CaptureStore, attach_rollout
    from llmtap.rollouts.attach import AttachOptions

    rows = tmp_path / "rollouts.jsonl"
    with CaptureStore(runs[0], create=False) as store:
        attached = [
            attach_rollout(
                {"_ng_rollout_id": rid, "reward": 1.0 if rid != EDITED_ROLLOUT else 0.5},
                store,
                options=AttachOptions(trajectory=False, include_payloads=True),
            )
            for rid in store.rollouts()
        ]
    rows.write_text("".join(json.dumps(row) + "\n" for row in attached))
    assert not is_comparison([str(rows), str(runs[1])])  # read together unless --compare says otherwise
    sources, sid_a, sid_b = discover_pair(str(rows), str(runs[1]))
    with _client(sources, (sid_a, sid_b)) as client:
        html = client.get(f"/compare/{sid_a}/{sid_b}/r/{EDITED_ROLLOUT}").text
        assert _pairs(html) == EDITED_STATUSES
        assert f'href="/s/{sid_a}/r/{EDITED_ROLLOUT}/c/3"' in html
        assert client.get(f"/s/{sid_a}/r/{EDITED_ROLLOUT}/c/3").status_code == 200
        summary = _summarised(client, f"/compare/{sid_a}/{sid_b}")
        assert "reward_dropped" not in summary  # run B's capture directory carries no rewards
