"""search/analysis/stats.py: the one interval formatter and the one paired verdict every table gives."""

import math

import pytest

from search.analysis.stats import interval, noise_verdict, paired, plus_minus

T_975_2 = 4.302652729749462  # Student t, 97.5% quantile, 2 degrees of freedom (scipy.stats.t.ppf(0.975, 2))


def test_one_value_is_its_mean_alone_with_no_interval():
    one = interval([4.25])
    assert (one.n, one.mean, one.half, one.has_interval) == (1, 4.25, None, False)
    assert math.isnan(one.low) and math.isnan(one.high)
    assert one.text() == "4.250"
    assert one.text(4, show_n=True) == "4.2500 (n=1)"
    assert interval([]).n == 0 and math.isnan(interval([]).mean)


def test_several_values_give_mean_plus_minus_the_student_t_half_width():
    three = interval([4.1, 4.3, 4.2])  # standard error 0.1 / sqrt(3)
    assert three.half == pytest.approx(T_975_2 * 0.1 / math.sqrt(3))  # 0.2484: not the std (0.1), not 1.96 x sem
    assert (three.low, three.high) == pytest.approx((4.2 - 0.24841, 4.2 + 0.24841), abs=1e-5)
    assert three.text() == "4.200 ± 0.248"
    assert three.text(show_n=True) == "4.200 ± 0.248 (n=3)"
    assert three.text(1, scale=100) == "420.0 ± 24.8"
    assert three.text(signed=True) == "+4.200 ± 0.248"
    assert plus_minus(-0.5, None, 2) == "-0.50" and plus_minus(0.5, 0.25, 2, signed=True) == "+0.50 ± 0.25"


def test_a_clearly_separated_pair_is_outside_noise():
    # a's seeds 4.10, 4.20, 4.15 against b's 4.60, 4.72, 4.64: differences -0.50, -0.52, -0.49
    difference = paired({0: 4.10, 1: 4.20, 2: 4.15}, {0: 4.60, 1: 4.72, 2: 4.64})
    assert difference.n == 3 and difference.mean == pytest.approx(-1.51 / 3)
    assert difference.outside_noise is True
    assert difference.text() == "-0.503 ± 0.038, outside noise"
    # identical differences: no spread, so any non-zero mean is outside noise
    assert paired([2.0, 2.0, 2.0], [2.5, 2.5, 2.5]).text() == "-0.500 ± 0.000, outside noise"


def test_an_overlapping_pair_is_within_noise_even_with_a_mean_difference():
    difference = paired([5.1, 4.8, 5.25], [5.0, 5.0, 5.0])  # differences +0.10, -0.20, +0.25
    assert difference.mean == pytest.approx(0.05) and difference.half == pytest.approx(0.5692, abs=1e-4)
    assert difference.outside_noise is False
    assert difference.text() == "+0.050 ± 0.569, within noise"


def test_one_pair_has_no_verdict_and_mappings_pair_the_seeds_both_have():
    one = paired([5.3], [5.0])
    assert one.outside_noise is None and one.text() == "+0.300, noise not measured (one seed)"
    both = paired({0: 1.0, 1: 2.0, 2: 3.0}, {1: 1.0, 2: 1.0, 5: 9.0})  # seeds 1 and 2: differences 1, 2
    assert (both.n, both.mean) == (2, 1.5)
    assert [noise_verdict(v) for v in (True, False, None)] == ["outside noise", "within noise",
                                                               "noise not measured (one seed)"]
    with pytest.raises(TypeError, match="two mappings"):
        paired({0: 1.0}, [1.0])
