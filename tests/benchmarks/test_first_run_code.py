"""first_run_code.py's counting, on coverage worked out by hand: calls per function from one take of V8's precise
coverage (pagehooks.functions_called, which the browser tests read it with too), and per change the functions
that nothing before it had called."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from first_run_code import first_runs, functions_called  # noqa: E402  (a script beside this test, not a package)


def fn(start: int, count: int) -> dict:
    return {"functionName": "", "isBlockCoverage": False,
            "ranges": [{"startOffset": start, "endOffset": start + 10, "count": count}]}


def test_functions_called_keeps_functions_with_calls_from_scripts_with_an_address():
    take = [{"scriptId": "7", "url": "http://x/page.js", "functions": [fn(0, 3), fn(40, 0), fn(90, 1)]},
            {"scriptId": "8", "url": "", "functions": [fn(0, 5)]},        # the harness's page.evaluate
            {"scriptId": "9", "url": "http://x/bokeh-3.9.2.min.js", "functions": [fn(12, 2)]}]
    assert functions_called(take) == {("7", "(anonymous)", 0): 3, ("7", "(anonymous)", 90): 1,
                                      ("9", "(anonymous)", 12): 2}
    assert functions_called(take, "/bokeh-") == {("9", "(anonymous)", 12): 2}        # the browser test's reading


def test_first_runs_counts_each_function_in_the_first_change_that_calls_it():
    before = {("7", 0): 40}                                               # the load and the passes
    changes = [{("7", 0): 2, ("7", 90): 6}, {("7", 0): 2, ("7", 90): 6, ("9", 5): 1}, {("7", 0): 2}]
    assert first_runs(before, changes) == [{("7", 90): 6}, {("9", 5): 1}, {}]
