"""tools/file_seconds.py sums a `--durations=0` report per file (setup, call and
teardown), and conftest.py orders the collection longest scope first."""
import json
import os
import sys

from conftest import ROOT, file_seconds, scope_of

sys.path.insert(0, os.path.join(ROOT, "tools"))
import file_seconds as tool  # noqa: E402

REPORT = """============ slowest durations ============
274.76s setup    tests/test_b.py::test_rows[0]
12.50s call     tests/test_a.py::test_one
3.25s teardown tests/test_b.py::test_rows[0]
0.50s call     tests/test_a.py::TestClass::test_two
1.00s call     tests/test_c.py::test_x[a::b]
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
= 5 passed in 300.0s =
"""


def test_a_report_is_summed_per_file(tmp_path, monkeypatch):
    log = tmp_path / "log"
    log.write_text(REPORT)
    monkeypatch.setattr(tool, "OUT", str(tmp_path / "seconds.json"))
    assert tool.main(str(log)) == 0
    written = json.loads((tmp_path / "seconds.json").read_text())
    assert written == {"tests/test_b.py": 278.0, "tests/test_a.py": 13.0, "tests/test_c.py": 1.0}
    assert list(written) == ["tests/test_b.py", "tests/test_a.py", "tests/test_c.py"]


def test_the_committed_seconds_name_test_files_and_the_session_is_ordered_by_them(request):
    seconds = file_seconds()
    assert seconds and all(os.path.isfile(os.path.join(ROOT, path)) for path in seconds)
    scopes = []
    for item in request.session.items:
        scope = scope_of(item.nodeid)
        if not scopes or scopes[-1] != scope:
            scopes.append(scope)
    assert len(scopes) == len(set(scopes)), "a scope's tests are not together"
    known = [sum(seconds[path] for path in seconds if scope_of(path) == scope)
             for scope in scopes if scope in seconds]
    assert known == sorted(known, reverse=True)
