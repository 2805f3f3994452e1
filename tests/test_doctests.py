"""The ``Example:`` sections of the public API run (doctest)."""
import doctest
import importlib

import pytest

MODULES = [
    'mmstats.stats.reporting',
    'mmstats.stats.collector',
    'mmstats.stats.pending',
    'mmstats.stats.protocol',
    'mmstats.stats.sketch',
    'mmstats.stats.sketch_sum',
    'mmstats.stats.workers',
    'mmstats.dist',
    'mmstats.sharding',
    'mmstats.precise_bn.update',
    'mmstats.precise_bn.batches',
    'mmstats.precise_bn.estimators',
    'mmstats.precise_bn.layers',
    'mmstats.precise_bn.recorder',
    'mmstats.hooks.schedule',
    'mmstats.hooks.strategies',
    'mmstats.hooks.stats_collector_hook',
    'mmstats.hooks.module_stats_hook',
    'mmstats.hooks.precise_bn_hook',
    'mmstats.utils.args',
    'mmstats.utils.checkpoint',
    'mmstats.utils.compat',
    'mmstats.utils.launcher',
    'mmstats.training_stats',
]


@pytest.mark.parametrize('name', MODULES)
def test_examples_run(name):
    result = doctest.testmod(
        importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_every_listed_api_has_an_example():
    import mmstats
    from mmstats import training_stats
    from mmstats.hooks.stats_collector_hook import WorkerBatches
    for obj in (mmstats.report, mmstats.report0, mmstats.Collector,
                mmstats.scaled_all_reduce, mmstats.update_bn_stats,
                mmstats.PreciseBNHook, mmstats.StatsCollectorHook,
                WorkerBatches, training_stats.report, training_stats.report0,
                training_stats.Collector):
        assert 'Example:' in obj.__doc__, obj
