"""Reference driver: NeMo Gym's own collector step that attaches a capture to rollout rows.

Runs in the reference venv. Reads {"capture_dir": str, "rows": [...]} and prints the rows after
its `merge_model_call_capture_into_record` (payloads left out, as its collector does by default).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nemo_gym.base_responses_api_model import merge_model_call_capture_into_record


def main() -> None:
    request = json.load(sys.stdin)
    rows = [merge_model_call_capture_into_record(dict(row), [Path(request["capture_dir"])]) for row in request["rows"]]
    json.dump(rows, sys.stdout, default=str)


if __name__ == "__main__":
    main()
