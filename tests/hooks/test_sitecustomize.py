"""The start-up hook `llmtap run` injects: it costs no imports, and the workload's own sitecustomize still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from llmtap.capsule.runner import site_directory

SITE = str(site_directory())
REPORT = "import json, sys, sitecustomize; print(json.dumps({'file': sitecustomize.__file__, 'path': sys.path, 'modules': sorted(sys.modules)}))"


def _python(code: str, pythonpath: list[str], capsule: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "LLMTAP_RUN_CAPSULE")}
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    if capsule is not None:
        env["LLMTAP_RUN_CAPSULE"] = str(capsule)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False)


def _capsule(tmp_path: Path) -> Path:
    capsule = tmp_path / "capsule"
    (capsule / "internal" / "health").mkdir(parents=True)
    (capsule / "calls").mkdir()
    return capsule


def _user_site(tmp_path: Path, body: str) -> Path:
    directory = tmp_path / "user-site"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(body)
    return directory


def test_the_workloads_own_sitecustomize_runs_and_keeps_its_changes(tmp_path: Path) -> None:
    user = _user_site(tmp_path, "import sys\nsys.path.insert(0, '/added-by-the-user')\nRAN = True\n")
    result = _python(REPORT, [SITE, str(user)], _capsule(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["file"] == str(user / "sitecustomize.py")
    assert "/added-by-the-user" in report["path"] and SITE not in report["path"]


def test_without_another_sitecustomize_the_hook_stays_and_leaves_the_path_as_it_was(tmp_path: Path) -> None:
    plain = json.loads(_python(REPORT.replace("sitecustomize.__file__", "None").replace(", sitecustomize", ""), []).stdout)
    result = _python(REPORT, [SITE], _capsule(tmp_path))
    report = json.loads(result.stdout)
    assert report["file"] == str(Path(SITE) / "sitecustomize.py")
    assert report["path"] == plain["path"]


def test_the_hook_loads_no_module_plain_python_does_not(tmp_path: Path) -> None:
    code = "import sys; print(' '.join(sorted(sys.modules)))"
    plain = set(_python(code, []).stdout.split())
    hooked = set(_python(code, [SITE], _capsule(tmp_path)).stdout.split())
    assert hooked - plain == {"sitecustomize"}


def test_a_failing_user_sitecustomize_is_reported_as_python_reports_it(tmp_path: Path) -> None:
    user = _user_site(tmp_path, "import no_such_module_for_llmtap\n")
    plain = _python("print('ran')", [str(user)])
    hooked = _python("print('ran')", [SITE, str(user)], _capsule(tmp_path))
    assert hooked.stdout == plain.stdout == "ran\n"
    assert hooked.stderr == plain.stderr
    assert "no_such_module_for_llmtap" in hooked.stderr
