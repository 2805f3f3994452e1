"""NonfiniteAlarm (``mmstats/health/alarm.py``): an iteration's flag is
known one iteration later, and on 2 gloo ranks every rank gets the same
answer when only one of them flagged."""
import torch

from mmstats.health import NonfiniteAlarm
from tests.helpers.dist import run_distributed


def test_a_flag_is_read_one_iteration_later():
    alarm = NonfiniteAlarm()
    answers = []
    for flag in (0., 1., None, 0., 0.):  # None: nothing watched
        alarm.ring(None if flag is None else torch.tensor(flag))
        answers.append(alarm.fired())
    assert answers == [False, False, True, False, False]


def _worker(rank, world_size):
    alarm = NonfiniteAlarm()
    answers = []
    for it in range(4):  # rank 1 alone flags iteration 1
        alarm.ring(torch.tensor(float(rank == 1 and it == 1)))
        answers.append(alarm.fired())
    return answers


def test_every_rank_hears_one_rank_flag():
    assert run_distributed(_worker, 2) == [[False, False, True, False]] * 2
