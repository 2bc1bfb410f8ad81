"""after_collection.py's summary of its loads: medians, how many loads were above 0, and what the pages said."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from after_collection import before_twin, summary  # noqa: E402  (scripts beside this test, not a package)
from bench_pages import READING_MS  # noqa: E402


def test_the_summary_gives_medians_loads_above_and_what_the_pages_said():
    loads = [{"twin_less_rest_ms": 1.5, "first_less_twin_ms": -0.2, "pass_after_collection": "drawn"},
             {"twin_less_rest_ms": 0.0, "first_less_twin_ms": 0.4, "pass_after_collection": "drawn"},
             {"twin_less_rest_ms": 2.0, "first_less_twin_ms": -1.0, "pass_after_collection": "nothing yet"}]
    assert summary(loads) == {"twin_less_rest_ms": (1.5, 2), "first_less_twin_ms": (-0.2, 1),
                              "pass_after_collection": {"drawn": 2, "nothing yet": 1}}


class FakePage:
    """What before_twin asks of a page: a DevTools session's command, and a wait."""
    def __init__(self):
        self.calls = []
        self.context = self

    def new_cdp_session(self, page):
        return self

    def send(self, method):
        self.calls.append(method)

    def wait_for_timeout(self, ms):
        self.calls.append(ms)


def test_only_the_collected_kind_collects_and_both_read_as_long():
    read, collected = FakePage(), FakePage()
    before_twin("read")(read)
    before_twin("collected")(collected)
    assert read.calls == [READING_MS]
    assert collected.calls == ["HeapProfiler.collectGarbage", READING_MS]
