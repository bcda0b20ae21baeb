"""entrypoint.control.awake: a watcher's own stalls are left out of the silence it counts."""

from entrypoint.control.awake import AwakeClock


class Ticks:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_rounds_within_the_slack_count_in_full():
    ticks = Ticks()
    clock = AwakeClock(slack=0.7, clock=ticks)
    heard = ticks.t
    for _ in range(30):
        ticks.t += 0.2
        clock.round()
    assert clock.lost == 0 and abs(clock.since(heard) - 6.0) < 1e-9
    assert abs(clock.now() - ticks.t) < 1e-9


def test_a_stall_of_the_watcher_is_left_out_of_the_silence_it_counts():
    ticks = Ticks()
    clock = AwakeClock(slack=0.7, clock=ticks)
    heard = ticks.t  # the peer's last word
    ticks.t += 0.2
    clock.round()
    ticks.t += 6.0  # the watcher held up 6 s: it could hear nothing
    clock.round()
    assert abs(clock.lost - 5.3) < 1e-9
    assert abs(clock.since(heard) - 0.9) < 1e-9  # 6.2 s of the clock, 0.9 s awake
    for _ in range(25):  # then awake, rounds of 0.2 s, and hearing nothing: that silence counts
        ticks.t += 0.2
        clock.round()
    assert abs(clock.since(heard) - 5.9) < 1e-9


def test_a_stall_before_the_last_word_does_not_shorten_the_silence_after_it():
    ticks = Ticks()
    clock = AwakeClock(slack=0.7, clock=ticks)
    ticks.t += 10.0
    clock.round()  # a stall of 9.3 s left out
    heard = ticks.t
    ticks.t += 4.0
    assert clock.since(heard) == 4.0
    assert clock.now() == ticks.t - clock.lost


def test_stalls_are_forgotten_once_far_behind():
    ticks = Ticks()
    clock = AwakeClock(slack=0.7, clock=ticks)
    ticks.t += 5.0
    clock.round()
    for _ in range(3100):
        ticks.t += 0.2
        clock.round()
    assert clock.lost > 4 and not clock._stalls
