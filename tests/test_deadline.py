"""The block-level hang guard the fault tests use: it interrupts, and gives the timer back."""

import re
import signal
import time

import pytest
from deadline import within


def test_a_block_past_its_time_is_interrupted_with_what_it_was():
    # Raised from inside the sleep: had the block been waited for, nothing would be raised.
    expected = re.escape("the sleeper did not end within 0.2 s")
    with pytest.raises(pytest.fail.Exception, match=expected), within(0.2, "the sleeper"):
        time.sleep(30)


def test_a_block_that_ends_in_time_leaves_no_alarm_behind():
    with within(5, "a quick block"):
        pass
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0


@pytest.mark.timeout(120, method="signal")
def test_the_tests_own_timeout_is_put_back_less_the_blocks_time():
    before = signal.getsignal(signal.SIGALRM)
    with within(5, "a short block"):
        time.sleep(0.3)
    remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    assert signal.getsignal(signal.SIGALRM) is before
    assert 100 < remaining < 119.8
