"""The V8 diagnosis's counting (v8_changes.windows): a trace cut at the benchmark's marks, on lines as V8 prints
them, counted by hand."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from v8_changes import windows  # noqa: E402  (a script beside this test, not a package)

LOG = """\
[marking 0x1 <JSFunction setSources (sfi = 0x2)> for optimization to MAGLEV, reason: hot and stable]
[completed compiling 0x1 <JSFunction setSources (sfi = 0x2)> (target MAGLEV) - took 0.001, 1.3, 0.3 ms]
0x3 <String[9]: #KVXMARK 0>
[bailout (kind: deopt-eager, reason: wrong map): begin. deoptimizing 0x4 <JSFunction c (sfi = 0x5)>, 0x6 <Code MAGLEV>, opt id 482
            ;;; deoptimize at <bokeh.min.js:206:954>
[bailout (kind: deopt-lazy, reason: (unknown)): begin. deoptimizing 0x7 <JSFunction select (sfi = 0x8)>, 0x9 <Code MAGLEV>
[bailout (kind: deopt-eager, reason: wrong map): begin. deoptimizing 0x17 <JSFunction (sfi = 0x18)>, 0x19 <Code MAGLEV>
[bailout (kind: deopt-eager, reason: wrong call target, type: Wasm): begin. deoptimizing wasm-function[1922], function index 1922
[marking dependent code 0xa <Code MAGLEV> (0xb <SharedFunctionInfo _paint>) (opt id 680) for deoptimization, reason: dependent field type changed]
[completed compiling 0xc <JSFunction set_data (sfi = 0xd)> (target MAGLEV) - took 0.000, 1.835, 0.029 ms]
[completed compiling 0xe <JSFunction (sfi = 0xf)> (target TURBOFAN_JS) - took 0.007, 0.882, 0.021 ms]
[completed optimizing 0xe <JSFunction (sfi = 0xf)> (target TURBOFAN_JS)]
0x10 <String[9]: #KVXMARK 1>
[completed compiling 0x11 <JSFunction get_length (sfi = 0x12)> (target MAGLEV) - took 0.001, 0.271, 0.012 ms]
0x13 <String[9]: #KVXMARK 2>
0x14 <String[10]: #KVXMARK -1>
[completed compiling 0x15 <JSFunction after (sfi = 0x16)> (target MAGLEV) - took 0.001, 0.1, 0.01 ms]
"""


def test_each_change_gets_the_lines_between_its_mark_and_the_next():
    per = windows(LOG)
    assert set(per) == {0, 1, 2}                                # before the first mark and after -1: no change's
    assert per[0] == {"bailouts": ["c: wrong map", "select: (unknown)", "(anonymous): wrong map"],   # not WebAssembly's
                      "invalidated": 1, "compiles": 2}
    assert per[1] == {"bailouts": [], "invalidated": 0, "compiles": 1}
    assert per[2] == {"bailouts": [], "invalidated": 0, "compiles": 0}


def test_an_unfinished_trace_still_ends_its_last_window():
    per = windows(LOG.split("0x14 <String")[0])            # the browser stopped before the end mark
    assert per[2] == {"bailouts": [], "invalidated": 0, "compiles": 0}
    assert per[0]["compiles"] == 2


def test_a_diagnosis_types_in_the_box_of_the_benchmark_run_it_diagnoses():
    """values_to_try picks its box by how many values it needs: asked for the tool's own count, it gave cross-layer's
    "share" (6 changes) where the report's run, 8 changes a load, types in "context". The plan is that run's box and
    its first values, then the twin (the opening value back, the first value again)."""
    from bench_pages import opening_value, values_to_try
    from v8_changes import BENCH_CHANGES, change_plan

    assert values_to_try("cross-layer", 6)[0] != values_to_try("cross-layer", BENCH_CHANGES)[0]   # else no test
    name, values = values_to_try("cross-layer", BENCH_CHANGES)
    assert change_plan("cross-layer", 6) == (name, values[:6] + [opening_value("cross-layer", name), values[0]])
    assert change_plan("cross-layer", 6, like=6)[0] == values_to_try("cross-layer", 6)[0]
