

def test_an_intervention_changes_one_answer_and_the_report_says_which(tmp_path: Path) -> None:
    capsule, output, env = _record(tmp_path)
    replacement = json.loads(fixture(FIXTURES["CHAT"]).body_text)
    replacement["choices"][0]["message"]["content"] = "What if?"
    override = tmp_path / "override.json"
    override.write_text(json.dumps({"rollout_id": "default", "call_index": 0, "response": replacement}))
    replayed = _llmtap(
        ["replay", str(capsule), "--replace", str(override), "--capsule-dir", str(tmp_path / "replayed"), "--json", "--",
         sys.executable, str(tmp_path / "workload.py")],
        env,
        tmp_path,
    )
    assert replayed.returncode == 0, replayed.stderr
    program = json.loads(replayed.stdout.splitlines()[0])
    assert program[0] == "What if?" and program[1:] == json.loads(output)[1:]
    report = json.loads(replayed.stdout[replayed.stdout.index("\n{") + 1 :])
    assert report["mode"] == "intervention" and report["replaced"] == [{"rollout_id": "default", "call_index": 0}]
