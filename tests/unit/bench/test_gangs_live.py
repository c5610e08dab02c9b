"""bench.gangs.live's pure parts: the interleaved creation order and the run's figures."""

from __future__ import annotations

from bench.gangs.live import Outcome, gang_sizes, interleaved


def test_members_are_created_interleaved_member_by_member_across_groups() -> None:
    assert interleaved([2, 3, 1]) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (1, 2)]


def test_gang_sizes_are_fixed_by_the_seed_and_within_bounds() -> None:
    sizes = gang_sizes(50, 4, 64, seed=28)
    assert sizes == gang_sizes(50, 4, 64, seed=28)
    assert all(4 <= s <= 64 for s in sizes) and len(set(sizes)) > 10


def test_pods_per_second_is_over_the_time_to_place_all_or_the_last_completion_when_some_never_completed() -> None:
    whole = Outcome("crane", gangs=2, pods=10, completed=2, place_all_s=5.0, last_completion_s=5.0, pods_completed=10)
    assert whole.pods_per_s == 2.0
    stuck = Outcome("ref", gangs=2, pods=10, completed=1, last_completion_s=4.0, pods_completed=6)
    assert stuck.pods_per_s == 1.5
    assert Outcome("none", gangs=2, pods=10).pods_per_s == 0.0
