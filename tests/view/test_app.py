"""The viewer's routes as a browser sees them: pages, escaping, the guard, pagination, rollouts files, capsules."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import httpx
import orjson
import pytest
from starlette.testclient import TestClient

import llmtap
from llmtap import CaptureStore, attach_rollout
from llmtap.view.guard import CONTENT_SECURITY_POLICY
from tests.fixtures import fixture
from tests.view.conftest import PORT, client_for
from tests.view.stores import T0, capture_line


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


def _elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    """Every element as a browser's parser sees it: (tag, attributes)."""
    parser = _Elements()
    parser.feed(html)
    return parser.found


PAGES = [
    "/",
    "/s/d1",
    "/s/d1/rows",
    "/s/d1/r/0-0",
    "/s/d1/r/0-0/live",
    "/s/d1/r/0-0/c/0",
    "/s/d1/r/1-0/c/0",
    "/s/d1/r/xss-0/c/0",
    "/s/d1/r/4-0/c/1",
]


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_with_the_strict_headers_and_no_inline_script(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["x-frame-options"] == "DENY" and response.headers["x-content-type-options"] == "nosniff"
    elements = _elements(response.text)
    fragment = path.endswith(("/rows", "/live"))  # the pieces live pages fetch carry no script at all
    assert [attrs for tag, attrs in elements if tag == "script"] == (
        [] if fragment else [{"src": "/static/view.js", "defer": None}]
    )
    assert not [(tag, name) for tag, attrs in elements for name in attrs if name.startswith("on")]
    links = [value or "" for _, attrs in elements for name, value in attrs.items() if name in ("href", "src")]
    assert all(link.startswith(("/", "?", "data:image/")) for link in links), links


def test_home_lists_every_rollout_with_its_counts_and_errors(client: TestClient) -> None:
    text = client.get("/s/d1").text
    ids = re.findall(r'<tr data-href="/s/d1/r/([^"]+)"', text)
    assert ids == ["0-0", "1-0", "2-0", "3-0", "4-0", "10-0", "xss-0"]
    row = text[text.index('data-id="2-0"') :].split("</tr>")[0]
    assert ">auth<" in row and "gpt-5.5-2026-04-23" in row
    damaged = text[text.index('data-id="4-0"') :].split("</tr>")[0]
    assert "+1" in damaged  # the damaged line is counted, not hidden


def test_sorting_and_filters_give_the_right_rows(client: TestClient) -> None:
    def ids(query: str) -> list[str]:
        return re.findall(r'<tr data-href="/s/d1/r/([^"]+)"', client.get("/s/d1?" + query).text)

    assert ids("sort=tokens_in&order=desc")[:2] == ["1-0", "0-0"]
    assert ids("status=error") == ["2-0", "3-0", "4-0"]
    assert ids("category=cancelled") == ["3-0"]
    assert ids("model=claude-sonnet-4-20250514") == ["1-0"]
    assert ids("q=xss") == ["xss-0"]
    assert ids("sort=ttft") == [
        "2-0",
        "4-0",
        "xss-0",
        "0-0",
        "3-0",
        "1-0",
        "10-0",
    ]  # 27, 90, 150, 180, 200, 350, 900 ms


def test_the_rollout_page_draws_one_bar_per_call_in_time_order_with_its_outcome(
    client: TestClient, capture_dir: tuple[Path, dict[str, list[str]]]
) -> None:
    _, outcomes = capture_dir
    for rollout_id, expected in outcomes.items():
        text = client.get(f"/s/d1/r/{rollout_id}").text
        bars = re.findall(r'<g class="bar o-(\w+)" data-call-index="(\d+)"', text)
        assert [outcome for outcome, _ in bars] == expected, rollout_id
    text = client.get("/s/d1/r/0-0").text
    assert "weather · 1.50 s" in text  # the gap between the calls, labelled with the tool the model asked for
    assert text.count('class="ttft"') == 2


def test_the_call_page_shows_the_conversation_response_usage_and_links(client: TestClient) -> None:
    text = client.get("/s/d1/r/1-0/c/0").text
    assert "What&#39;s the weather in Florence,Italy?" in text
    assert "I&#39;ll get the weather information for Florence, Italy for you." in text
    assert "16 stream event(s)" in text and "content_block_delta" in text
    assert 'data-next="/s/d1/r/1-0/c/1"' in text and "data-prev" not in text
    assert "394 / 67" in text  # tokens in / out
    assert "1 tool definition(s)" in text


def test_capture_text_is_escaped_everywhere(client: TestClient) -> None:
    for path in ("/s/d1/r/xss-0/c/0", "/s/d1/r/xss-0"):
        text = client.get(path).text
        assert "<script>window" not in text and "<img src=x" not in text and "<svg onload" not in text
    text = client.get("/s/d1/r/xss-0/c/0").text
    assert "&lt;script&gt;window.__xss = 1;" in text
    assert 'href="javascript:' not in text and "{{7*7}}" in text.replace("&#123;", "{")
    assert "&lt;img src=x onerror=&#34;window.__xss=2;alert(2)&#34;&gt;" in text


@pytest.mark.parametrize(
    "path",
    [
        "/s/d9",
        "/s/d1/r/%2E%2E",
        "/s/d1/r/.hidden",
        "/s/d1/r/a%2Fb",
        "/s/d1/r/nope-0",
        "/s/d1/r/0-0/c/99",
        "/s/d1/r/0-0/c/-1",
        "/s/d1/r/0-0/c/1e3",
    ],
)
def test_bad_path_parameters_are_not_found(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404


def test_host_origin_and_method_checks_refuse_rebinding_and_cross_site_requests(client: TestClient) -> None:
    assert client.get("/", headers={"host": "evil.example:8765"}).status_code == 421
    assert client.get("/", headers={"host": "127.0.0.1.evil.example"}).status_code == 421
    assert client.get("/", headers={"host": "127.0.0.1:9999"}).status_code == 421
    assert client.get("/", headers={"origin": "http://evil.example"}).status_code == 403
    assert client.get("/", headers={"origin": "null"}).status_code == 403
    assert client.get("/", headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert client.post("/", content=b"x").status_code == 405
    assert (
        client.get("/", headers={"host": f"localhost:{PORT}", "origin": f"http://localhost:{PORT}"}).status_code == 200
    )
    refused = client.get("/s/d1/r/0-0", headers={"host": "evil.example"})
    assert "weather" not in refused.text and refused.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


def test_static_files_stay_inside_the_package(client: TestClient) -> None:
    assert client.get("/static/view.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/../app.py").status_code == 404
    assert client.get("/static/%2e%2e/app.py").status_code == 404


def test_a_rollouts_file_shows_reward_attribution_and_trajectory(
    tmp_path: Path, capture_dir: tuple[Path, dict[str, list[str]]]
) -> None:
    root, _ = capture_dir
    store = CaptureStore(root, create=False)
    last = llmtap.read_model_call_records(store, "0-0")[-1]
    rows = [
        attach_rollout({"_ng_rollout_id": "0-0", "response": last.response, "reward": 1.0}, store),
        attach_rollout({"_ng_rollout_id": "1-0", "response": {"id": "elsewhere"}, "reward": 0.0}, store),
    ]
    output = tmp_path / "rollouts.jsonl"
    output.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows) + b"{torn")
    client = client_for([output, root])
    home = client.get("/s/f1").text
    assert re.findall(r'<tr data-href="/s/f1/r/([^"]+)"', home) == ["0-0", "1-0"]
    assert ">attributed<" in home and ">abstained<" in home
    assert re.findall(r'<tr data-href="/s/f1/r/([^"]+)"', client.get("/s/f1?sort=reward&order=desc").text) == [
        "0-0",
        "1-0",
    ]
    assert re.findall(r'<tr data-href="/s/f1/r/([^"]+)"', client.get("/s/f1?status=unattributed").text) == ["1-0"]
    page = client.get("/s/f1/r/0-0").text
    assert "terminal call" in page and last.model_call_id in page and "Trajectory" in page
    assert page.count('<span class="pill ok">terminal</span>') == 1
    alone = client_for([output]).get("/s/f1/r/0-0/c/1").text  # without the capture dir: the attached record only
    assert "which was not given" in alone and last.model_call_id in alone


def test_a_run_capsule_shows_its_manifest_and_calls(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with llmtap.capture(runs_dir=runs) as run:
        pass
    assert run.capsule_dir is not None
    with CaptureStore(run.capsule_dir / "calls") as store:
        store.append("task-7", capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0, latency_ms=120.0))
    client = client_for([runs])
    home = client.get("/").text
    assert f"/s/{run.run_id}" in home
    page = client.get(f"/s/{run.run_id}").text
    assert "success" in page and "task-7" in page
    assert client.get(f"/s/{run.run_id}/r/task-7/c/0").status_code == 200


def test_the_live_stream_announces_an_appended_call(capture_dir: tuple[Path, dict[str, list[str]]]) -> None:
    from tests.view.browser import viewer_serving

    root, _ = capture_dir
    with viewer_serving([root], poll_seconds=0.05) as url, httpx.Client(trust_env=False, timeout=10) as http:
        with http.stream("GET", url + "/s/d1/r/0-0/events") as events:
            lines = events.iter_lines()
            assert next(lines) == "retry: 2000"
            with CaptureStore(root) as store:
                store.append("0-0", capture_line(fixture("chat/text-basic-gpt4o"), started_at=T0 + 3, latency_ms=100.0))
            received = [next(lines) for _ in range(3)]
        assert "event: changed" in received
        assert "#2" in http.get(url + "/s/d1/r/0-0/live").text


def test_inline_images_show_as_thumbnails_and_remote_ones_are_never_loaded(tmp_path: Path) -> None:
    recorded = fixture("chat/image-input-stream-gpt4o")
    remote = json.loads(json.dumps(recorded.request_json))
    remote["messages"][0]["content"][1]["image_url"]["url"] = "https://tracker.example/pixel.png"
    svg = json.loads(json.dumps(recorded.request_json))
    svg["messages"][0]["content"][1]["image_url"]["url"] = "data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+"
    with CaptureStore(tmp_path) as store:
        store.append("img-0", capture_line(recorded, started_at=T0, latency_ms=300.0))
        store.append("img-0", capture_line(recorded, started_at=T0 + 1, latency_ms=300.0, request=remote))
        store.append("img-0", capture_line(recorded, started_at=T0 + 2, latency_ms=300.0, request=svg))
    client = client_for([tmp_path])
    images = [attrs for tag, attrs in _elements(client.get("/s/d1/r/img-0/c/0").text) if tag == "img"]
    assert len(images) == 1 and (images[0]["src"] or "").startswith("data:image/jpeg;base64,/9j/")
    for index in (1, 2):  # a remote URL, or an SVG (which can carry script), stays text in the raw line
        text = client.get(f"/s/d1/r/img-0/c/{index}").text
        assert not [attrs for tag, attrs in _elements(text) if tag == "img"]
        assert "image_url" in text
