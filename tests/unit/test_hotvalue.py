from datetime import timedelta

import pytest

from crane_shared.hotvalue import hot_value, window_starts, windows
from crane_shared.policy import HotValuePolicy, default_policy

FIVE_MIN = timedelta(minutes=5)
ONE_MIN = timedelta(minutes=1)
DEFAULT_RULES = default_policy().hot_value


@pytest.mark.parametrize(
    ("in_5m", "in_1m", "expected"),
    [
        (0, 0, 0),
        (6, 6, 4),  # floor(6/5) + floor(6/2)
        (4, 1, 0),
        (5, 2, 2),
        (10, 0, 2),
        (9, 9, 5),
    ],
)
def test_default_rules_follow_upstream_formula(in_5m, in_1m, expected):
    assert hot_value({FIVE_MIN: in_5m, ONE_MIN: in_1m}, DEFAULT_RULES) == expected


def test_no_rules_means_never_hot():
    assert hot_value({FIVE_MIN: 1000}, ()) == 0


def test_rules_sharing_a_window_each_add_their_share():
    rules = (HotValuePolicy(ONE_MIN, 2), HotValuePolicy(ONE_MIN, 3))
    assert windows(rules) == (ONE_MIN,)
    assert hot_value({ONE_MIN: 6}, rules) == 3 + 2


def test_missing_window_count_is_an_error_not_zero():
    with pytest.raises(KeyError, match="0:01:00"):
        hot_value({FIVE_MIN: 3}, DEFAULT_RULES)


def test_negative_count_is_rejected():
    with pytest.raises(ValueError, match="negative"):
        hot_value({FIVE_MIN: -1, ONE_MIN: 0}, DEFAULT_RULES)


def test_window_starts_are_now_minus_each_range():
    assert window_starts(1_000.0, DEFAULT_RULES) == {FIVE_MIN: 700.0, ONE_MIN: 940.0}
