"""ModuleStatsHook's health options read nothing back to the host on an
iteration that does not publish: per iteration, the calls that read a
tensor's value on the host (``item``, ``tolist``, ``__bool__``,
``__float__``, ``__int__``, ``cpu``, ``numpy``: on a GPU each is a sync)
are counted through a real Runner, with each option on and with both off,
around everything the Runner runs in the iteration (every hook's
``before_train_iter`` / ``after_train_iter`` and ``train_step``). Counts,
not times."""
import pytest
from mmengine.hooks import Hook
from mmengine.runner import Runner
from torch import Tensor
from torch.overrides import TorchFunctionMode

from tests.helpers.module_stats import module_stats_cfg

READS = {
    Tensor.item, Tensor.tolist, Tensor.__bool__, Tensor.__float__,
    Tensor.__int__, Tensor.cpu, Tensor.numpy
}


class CountReads(TorchFunctionMode):

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


class Enter(Hook):
    priority = 'HIGHEST'  # before every other before_train_iter

    def __init__(self, mode):
        self.mode = mode

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.mode.count = 0
        self.mode.__enter__()


class Leave(Hook):
    priority = 'LOWEST'  # after every other after_train_iter

    def __init__(self, mode):
        self.mode, self.counts = mode, {}

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.mode.__exit__(None, None, None)
        self.counts[runner.iter + 1] = self.mode.count


def reads(work_dir, optimizer, **options):
    cfg = module_stats_cfg(work_dir, {}, options)
    cfg.optim_wrapper.optimizer = optimizer
    runner = Runner.from_cfg(cfg)
    mode = CountReads()
    leave = Leave(mode)
    runner.register_hook(Enter(mode))
    runner.register_hook(leave)
    runner.train()
    return leave.counts


@pytest.mark.parametrize(
    'optimizer',
    [dict(type='AdamW', lr=1e-3),
     dict(type='SGD', lr=0.1, momentum=0.9)],
    ids=['AdamW', 'SGD-momentum'])
def test_no_host_read_off_the_publications(tmp_path, clean_mmengine,
                                           optimizer):
    base = reads(tmp_path / 'base', optimizer)
    state = reads(tmp_path / 'state', optimizer, optimizer_state=True)
    watch = reads(tmp_path / 'watch', optimizer, watch_nonfinite=True)
    assert sorted(base) == sorted(state) == sorted(watch) == list(range(1, 7))
    for it in base:
        published = it % 3 == 0
        # the optimizer state: one read of the reduced block, at a
        # publication only; the watch: none on a healthy run
        expected = 1 if published else 0
        assert state[it] - base[it] == expected, (it, state, base)
        assert watch[it] == base[it], (it, watch, base)
