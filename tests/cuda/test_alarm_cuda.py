"""NonfiniteAlarm with CUDA flags: ringing never synchronises (the copy
goes to pinned memory, non-blocking), and the flag is read one iteration
later (skipped without CUDA)."""
import torch

from mmstats.health import NonfiniteAlarm
from .common import requires_cuda, sync_debug_error

pytestmark = requires_cuda


def test_cuda_flags_are_read_one_iteration_later_without_a_sync():
    alarm = NonfiniteAlarm()
    answers = []
    for flag in (0., 1., 0., 0., 1., 1.):
        value = torch.tensor(flag, device='cuda')
        with sync_debug_error():
            alarm.ring(value)
        answers.append(alarm.fired())
    assert answers == [False, False, True, False, False, True]
