"""The benchmarks' JSON outlives a browser test run: pytest-playwright empties its --output folder as a session
starts, and the benchmarks write to test-results/bench by default (the report reads it from there)."""
import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]


def playwright_output() -> Path:
    opts = shlex.split(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"])
    given = [o.split("=", 1)[1] for o in opts if o.startswith("--output=")]
    return Path(given[-1] if given else "test-results")         # pytest-playwright's default


def test_the_folder_playwright_empties_holds_no_benchmark_output():
    emptied = playwright_output()
    defaults = {m for script in (ROOT / "tests" / "benchmarks").glob("*.py")
                for m in re.findall(r'default=(?:Path\()?"(test-results/[^"]+)"', script.read_text())}
    assert "test-results/bench" in defaults                     # what report.py reads
    for default in sorted(defaults):
        assert not Path(default).is_relative_to(emptied), f"{default} is inside {emptied}, which each browser run empties"
