"""run_pytest against pytest itself: the counts and failures its JUnit XML gives, the environment the
child sees, and a run killed at its time limit."""
import textwrap

from engine.gpu_check.pytest_run import run_pytest, run_pytest_parallel

SAMPLE = textwrap.dedent("""
    import os, time, pytest

    def test_passes():
        assert os.environ["GPU_CHECK_SET"] == "1" and "GPU_CHECK_REMOVED" not in os.environ

    def test_fails():
        assert 1 + 1 == 3, "arithmetic broke"

    @pytest.mark.skip(reason="not here")
    def test_skipped():
        pass

    def test_sleeps():
        if os.environ.get("GPU_CHECK_SLEEP"):
            time.sleep(600)
""")


def test_counts_and_failures_come_from_pytest_and_the_environment_is_as_asked(tmp_path, monkeypatch):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    monkeypatch.setenv("GPU_CHECK_REMOVED", "yes")
    run = run_pytest([str(tmp_path / "test_sample.py")], {"GPU_CHECK_SET": "1", "GPU_CHECK_REMOVED": None}, 120)
    assert run.counts == {"passed": 2, "failed": 1, "errors": 0, "skipped": 1}
    assert not run.passed and run.returncode == 1
    [failure] = run.failures
    assert failure["test"].endswith("test_fails") and any("arithmetic broke" in line for line in failure["message"])
    assert run.to_json()["output_tail"]


def test_a_run_past_its_time_limit_is_killed_and_counts_what_finished_before(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    run = run_pytest([str(tmp_path / "test_sample.py"), "-k", "passes or sleeps"],
                     {"GPU_CHECK_SET": "1", "GPU_CHECK_SLEEP": "1"}, 8)
    assert run.returncode is None and not run.passed and run.to_json()["timed_out"]
    assert run.counts["passed"] == 1


def test_tests_dealt_to_several_processes_add_up_to_one_run(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    run = run_pytest_parallel(["test_sample.py", "-k", "not sleeps"], {"GPU_CHECK_SET": "1"}, 120, 3, cwd=tmp_path)
    assert run.counts == {"passed": 1, "failed": 1, "errors": 0, "skipped": 1}
    assert run.returncode == 1 and [f["test"].rsplit("::")[-1] for f in run.failures] == ["test_fails"]
