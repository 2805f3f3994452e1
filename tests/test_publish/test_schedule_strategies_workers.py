"""``mmstats/publish`` without a Runner, the modules test_layout_and_line
does not reach: ``schedule.find_hook``, ``strategies`` (the deny-list the
hooks refuse at ``before_run``) and ``worker_loaders`` (the loaders'
``collate_fn`` wrapped once, a loader with workers returned)."""
from types import SimpleNamespace

import pytest
from mmengine.hooks import CheckpointHook, EMAHook, LoggerHook
from torch.utils.data import DataLoader

from mmstats.publish.schedule import find_hook
from mmstats.publish.strategies import UNCHECKED, refuse_unchecked_strategy
from mmstats.publish.worker_loaders import enable_worker_reporting


def test_find_hook_returns_the_first_of_its_type_and_waits_for_ready():
    first, second = LoggerHook(interval=3), LoggerHook(interval=7)
    runner = SimpleNamespace(hooks=[CheckpointHook(), first, second])
    assert find_hook(runner, LoggerHook) is first
    assert find_hook(runner, EMAHook) is None
    second.some_state = 1  # only the second one is ready
    assert find_hook(runner, LoggerHook, ready='some_state') is second


def test_an_unchecked_strategy_is_refused_naming_it_and_others_pass():
    for name in UNCHECKED:
        runner = SimpleNamespace(strategy=type(name, (), {})())
        with pytest.raises(RuntimeError, match=f'MyHook: {name} is not'):
            refuse_unchecked_strategy(runner, 'MyHook')
    runner = SimpleNamespace(strategy=type('DDPStrategy', (), {})())
    refuse_unchecked_strategy(runner, 'MyHook')  # accepted


def test_worker_reporting_wraps_each_loader_once():
    plain = DataLoader(range(4))
    workers = DataLoader(range(4), num_workers=1)
    runner = SimpleNamespace(
        _train_loop=SimpleNamespace(dataloader=plain),
        _val_loop=SimpleNamespace(dataloader=workers))
    first = enable_worker_reporting(runner)
    assert first == [workers.collate_fn]  # only the one with workers
    wrapped = plain.collate_fn
    assert enable_worker_reporting(runner) == first  # idempotent
    assert plain.collate_fn is wrapped
    assert [int(batch) for batch in plain] == [0, 1, 2, 3]  # same batches
