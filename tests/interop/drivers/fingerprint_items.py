"""Reference driver: NeMo Gym's own content fingerprint (version 2) of lists of items.

Runs in the reference venv. Reads {"item_lists": [[...], ...]} and prints, per list, what its
`assistant_fingerprint` gives, with its `FINGERPRINT_VERSION`.
"""

from __future__ import annotations

import json
import sys

from nemo_gym.token_id_capture.fingerprint import FINGERPRINT_VERSION, assistant_fingerprint


def main() -> None:
    request = json.load(sys.stdin)
    fingerprints = [assistant_fingerprint(items) for items in request["item_lists"]]
    json.dump({"version": FINGERPRINT_VERSION, "fingerprints": fingerprints}, sys.stdout)


if __name__ == "__main__":
    main()
