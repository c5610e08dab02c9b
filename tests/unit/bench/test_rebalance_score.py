from bench.rebalance.score import Outcome, minimum_evictions, table


def test_the_minimum_moves_the_biggest_users_first() -> None:
    # 8 cores, base 20 %: one pod of 4 cores and two of 1 core make 95 %; moving the big one is enough
    assert minimum_evictions(0.2, [1.0, 4.0, 1.0], 8.0, 0.65) == 1
    assert minimum_evictions(0.2, [2.0, 2.0, 2.0], 8.0, 0.65) == 2
    assert minimum_evictions(0.2, [1.0], 8.0, 0.65) == 0
    assert minimum_evictions(0.7, [1.0], 8.0, 0.65) == -1


def test_the_table_puts_backends_side_by_side() -> None:
    crane = Outcome("crane", 5.0, first_eviction_at=30.0, cool_at=42.0, evictions=2, minimum=2)
    other = Outcome("other", 5.0, evictions=0, minimum=2)
    text = table([crane, other])
    assert "| | crane | other |" in text
    assert "| minutes until no node is hot (from the drift) | 0.7 | never |" in text
    assert "| rounds from the first eviction until no node is hot (target <= 3) | 3 | never |" in text
    assert "| seconds from the drift to the first eviction | 30 | never |" in text
    assert "| 2 (2) | 0 (2) |" in text
