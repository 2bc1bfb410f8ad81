"""The page benchmark's verdict on a first change against its twin (bench_pages.first_against_twin): the one-sided
sign test's chance, worked out by hand on small cases, and the loads too few for it to tell."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from bench_pages import first_against_twin  # noqa: E402  (a script beside this test, not a package)


@pytest.mark.parametrize("differences, above, p, no_slower", [
    ([0.1] * 8, 8, 1 / 256, False),                         # every first above its twin: slower
    ([0.1] * 7 + [-0.1], 7, 9 / 256, False),                # 7 of 8: P(X >= 7) = (8 + 1) / 256 = 0.035
    ([0.1] * 6 + [-0.1] * 2, 6, 37 / 256, True),            # 6 of 8: (28 + 8 + 1) / 256 = 0.145, alike
    ([0.1, -0.1] * 4, 4, 163 / 256, True),                  # half: (70 + 56 + 28 + 8 + 1) / 256
    ([0.0, 0.0, 0.1, 0.1, 0.1, 0.1, 0.1], 5, 1 / 32, False),  # ties dropped: 5 of 5 left
    ([0.1] * 4, 4, 1 / 16, None),                           # 4 loads: even all above is p = 0.0625, cannot tell
])
def test_the_sign_test_on_small_cases(differences, above, p, no_slower):
    verdict = first_against_twin(differences)
    assert verdict["above"] == above and verdict["loads"] == len(differences)
    assert verdict["sign_test_p"] == round(p, 3)
    assert verdict["no_slower"] is no_slower


def test_the_median_difference_is_reported():
    assert first_against_twin([0.3, -0.1, 0.05, 0.2, -0.4])["median_ms"] == 0.05


@pytest.mark.parametrize("differences, upper", [
    ([0.5, -0.2, 0.1, 0.3, -0.4, 0.2], 0.5),                # 6 loads: P(Bin(6) <= 5) = 63/64, the largest
    ([float(d) for d in range(12)], 9.0),                   # 12: P(Bin(12) <= 8) = 0.927, <= 9 = 0.981: the 10th
    ([0.1] * 4, None),                                      # 4: even the largest is only a 15/16 = 0.94 bound
])
def test_the_upper_bound_of_how_much_slower_a_first_could_be(differences, upper):
    assert first_against_twin(differences)["upper_95_ms"] == upper
