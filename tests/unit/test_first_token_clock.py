"""generate's "first token ... s after process start" counts from the process's start, not from
psutil's create time (boot time rounded to whole seconds plus the start: up to a second late)."""

import time

import psutil

from flexlamps.commands.generate import _since_process_start


def test_time_since_process_start_is_not_overstated():
    since = _since_process_start()
    assert 0 < since <= time.time() - psutil.Process().create_time() + 0.02  # one clock tick of slack
    time.sleep(0.05)
    assert 0.04 <= _since_process_start() - since < 30  # it follows the clock (a loaded box may oversleep)
