"""The questions people ask of `llmtap query`, as SQL: shown in the README, run by the tests and the bench."""

from __future__ import annotations

__all__ = ["QUESTIONS"]

QUESTIONS: dict[str, str] = {
    "error rate by model": """SELECT model, count(*) AS calls, round(avg(is_error::INT), 3) AS error_rate
FROM calls GROUP BY model ORDER BY error_rate DESC, calls DESC, model""",
    "p95 TTFT by hour": """SELECT date_trunc('hour', started_at) AS hour, count(latency_ttft_ms) AS calls,
       quantile_cont(latency_ttft_ms, 0.95) AS p95_ttft_ms
FROM calls WHERE stream GROUP BY hour ORDER BY hour""",
    "tokens per rollout": """SELECT rollout_id, num_calls, tokens_in, tokens_out, tokens_total, reward
FROM rollouts ORDER BY tokens_total DESC NULLS LAST, rollout_id LIMIT 20""",
    "which tool fails most": """WITH results AS (SELECT unnest(tool_result_names) AS tool FROM calls),
     failures AS (SELECT unnest(tool_error_names) AS tool FROM calls)
SELECT tool, count(*) AS results,
       (SELECT count(*) FROM failures f WHERE f.tool = r.tool) AS failures
FROM results r GROUP BY tool ORDER BY failures DESC, results DESC, tool""",
    "errors by dialect and category": """SELECT dialect, error_category, count(*) AS calls
FROM calls WHERE is_error GROUP BY ALL ORDER BY calls DESC, dialect, error_category""",
}
