"""Reference driver: NeMo Gym's own reader and metrics on a capture directory.

Runs in the reference venv. Reads {"capture_dir": str, "rollout_ids": [...]} and prints, per id,
the records its `read_model_call_records` builds (every field, as JSON) and the metrics of its
`aggregate_model_call_metrics`.
"""

from __future__ import annotations

import json
import sys

from nemo_gym.base_responses_api_model import CaptureStore, aggregate_model_call_metrics, read_model_call_records


def main() -> None:
    request = json.load(sys.stdin)
    store = CaptureStore(request["capture_dir"])
    result = {}
    for rollout_id in request["rollout_ids"]:
        records = read_model_call_records(store, rollout_id)
        result[rollout_id] = {
            "records": [record.model_dump(mode="json") for record in records],
            "metrics": aggregate_model_call_metrics(store, rollout_id),
        }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
