"""scheduler_perf's throughput sampling, as the benches report it beside first-to-last-bind rates."""

from __future__ import annotations

from bench.scheduler.__main__ import Run, sampled_throughput


def test_the_first_tick_with_pods_scheduled_is_skipped_and_the_partial_last_interval_not_sampled() -> None:
    # ticks at 1, 2, 3, 4: nothing by 1; 10 by 2 (first: skipped); 30 by 3; 35 by 4; the last 5 after 4 unsampled
    times = [1.5] * 10 + [2.5] * 20 + [3.5] * 5 + [4.2] * 5
    assert sampled_throughput(times) == [20.0, 5.0]


def test_empty_ticks_repeat_the_next_sample_over_the_intervals_they_cover() -> None:
    times = [0.5] * 4 + [3.5] * 6 + [4.9]  # ticks 2 and 3 see nothing new: 6 pods over 3 s, recorded three times
    assert sampled_throughput(times) == [2.0, 2.0, 2.0]


def test_a_run_that_ends_within_an_interval_of_its_first_scheduled_tick_has_no_sample() -> None:
    run = Run("crane", 100, 100, 0.3, 1.4, bind_times=[1.1 + i * 0.003 for i in range(100)])
    assert sampled_throughput(run.bind_times) == []
    assert run.sampled_rate != run.sampled_rate  # NaN: scheduler_perf would report no throughput either
    assert run.rate > 300
