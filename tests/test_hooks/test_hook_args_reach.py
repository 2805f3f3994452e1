"""Arguments reach what they configure: StatsCollectorHook's keep_previous
reaches its collectors; a LogProcessor custom_cfg entry of the user's wins
over the one the hook adds for its timing keys."""
from unittest.mock import MagicMock

import pytest
from mmengine.runner import LogProcessor

from mmstats import report
from mmstats.hooks import StatsCollectorHook
from mmstats.publish.text_line import log_current_value


@pytest.mark.parametrize('keep_previous', [True, False])
def test_keep_previous_reaches_the_collectors(keep_previous):
    hook = StatsCollectorHook(
        collect=('outputs', ), keep_previous=keep_previous)
    hook.before_run(MagicMock(hooks=[]))  # the collectors live from here
    report('a', 1.0)
    assert hook.collect('train')['a']['num'] == 1
    again = hook.collect('train')['a']  # no new value of 'a'
    if keep_previous:
        assert again['num'] == 1 and again['mean'] == 1.0
    else:
        assert again['num'] == 0 and again['mean'] != again['mean']  # NaN


def test_users_custom_cfg_wins():
    mine = dict(data_src='loss', method_name='max', window_size=10)
    processor = LogProcessor(custom_cfg=[dict(mine)])
    log_current_value(processor, 'loss')  # the user's entry stays alone
    assert processor.custom_cfg == [mine]
    log_current_value(processor, 'time')  # averaged by default: current
    assert processor.custom_cfg == [
        mine, dict(data_src='time', method_name='current')
    ]
    log_current_value(processor, 'time')  # once
    log_current_value(processor, 'acc/mean')  # not averaged: nothing
    assert len(processor.custom_cfg) == 2
