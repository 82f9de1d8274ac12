"""``pytest --gac-report`` into a directory that does not exist yet (a fresh CI checkout): the
directory is created at the end of the session; a path under a file is a usage error."""
from __future__ import annotations

pytest_plugins = ["pytester"]


def test_gac_report_creates_missing_directories(pytester) -> None:
    pytester.makepyfile("def test_ok():\n    assert True\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--gac-report",
                                          "reports/ci/run.html")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "reports/ci/run.html").is_file()
    assert (pytester.path / "reports/ci/run.json").is_file()
    result.stdout.fnmatch_lines(["gac-check report: reports/ci/run.html"])


def test_gac_report_under_a_file_is_a_usage_error(pytester) -> None:
    pytester.makepyfile("def test_ok():\n    assert True\n")
    (pytester.path / "reports").write_text("a file")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--gac-report",
                                          "reports/run.html")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--gac-report*not a directory*"])
