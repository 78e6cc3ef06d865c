"""`llmtap records show` lists the tool calls the provider ran itself, apart from the agent's."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from llmtap.cli import main
from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.store import CaptureStore
from tests.fixtures import fixture


def _capture(store: CaptureStore, rollout_id: str, name: str) -> None:
    recorded = fixture(name)
    exchange = Exchange(method="POST", path=recorded.request_path, request_body=json.dumps(recorded.request_json).encode())
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    exchange.add_response_chunk(recorded.body_bytes)
    store.append(rollout_id, raw_line_from_exchange(exchange))


def test_records_show_lists_hosted_tool_calls_of_both_dialects(tmp_path: Path) -> None:
    with CaptureStore(tmp_path) as store:
        _capture(store, "0-0", "messages/web-search-sonnet4")
        _capture(store, "0-0", "responses/web-search-gpt41")
    result = CliRunner().invoke(main, ["records", "show", str(tmp_path), "0-0"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    messages = json.loads(fixture("messages/web-search-sonnet4").body_text)
    [server_call] = [block for block in messages["content"] if block["type"] == "server_tool_use"]
    responses = json.loads(fixture("responses/web-search-gpt41").body_text)
    [search] = [item for item in responses["output"] if item["type"] == "web_search_call"]
    hosted = result.output[result.output.index("hosted tool calls") :]
    assert server_call["id"] in hosted and "server_tool_use" in hosted
    assert search["id"] in hosted and "web_search_call" in hosted


def test_records_show_prints_no_hosted_table_without_hosted_calls(tmp_path: Path) -> None:
    with CaptureStore(tmp_path) as store:
        _capture(store, "0-0", "chat/tool-call-gpt4o")
    result = CliRunner().invoke(main, ["records", "show", str(tmp_path), "0-0"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "hosted tool calls" not in result.output
