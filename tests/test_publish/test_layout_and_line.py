"""``mmstats/publish`` without a Runner: the keys StatsLayout gives each
statistic, the collectors' patterns, what a one-value name keeps, and the
text line (stale keys taken out, the user's ``custom_cfg`` left alone)."""
import re
from types import SimpleNamespace

from mmengine.logging import MessageHub
from mmengine.runner import LogProcessor

from mmstats.publish import (StatsLayout, collector_patterns, one_value_stats,
                             write_text_line)


def test_outputs_are_published_under_their_own_names():
    layout = StatsLayout('stats', ('mean', 'max'), ('max', ),
                         re.compile('loss'), None, True)
    results = layout.published({
        'train_step/loss':
        dict(mean=1., max=2., nonfinite=0),
        'feat':
        dict(mean=3., max=4., nonfinite=0)
    })
    assert layout.scalars(results) == {
        'stats/loss/mean': 1.,
        'stats/loss/max': 2.,
        'stats/feat/mean': 3.,
        'stats/feat/max': 4.
    }
    assert layout.scalars(results, text=True) == {'loss/max': 2.}


def test_collector_patterns_keep_the_phases_apart():
    patterns = {k: re.compile(v) for k, v in collector_patterns('a|b').items()}
    assert patterns['train'].match('train_step/a')
    assert patterns['train'].match('b')
    assert not patterns['train'].match('val/a')
    assert patterns['val'].match('val/b') and not patterns['val'].match('b')
    assert patterns['test'].match('test/a')


def test_a_one_value_name_keeps_its_value_and_nonfinite():
    assert one_value_stats(
        ('num', 'std', 'min', 'p90', 'nonfinite'),
        ('num', 'std', 'min', 'nonfinite')) == ('min', 'nonfinite')


def test_the_text_line_drops_stale_keys_and_keeps_the_users_cfg():
    processor = LogProcessor(
        custom_cfg=[dict(data_src='loss/max', method_name='mean')])
    runner = SimpleNamespace(
        message_hub=MessageHub('publish_text_line'), log_processor=processor)
    keys = write_text_line(runner, 'train', {'loss/max': 1., 'a': 2.}, set())
    keys = write_text_line(runner, 'train', {'a': 3.}, keys)
    assert keys == {'train/a'}
    assert sorted(runner.message_hub.log_scalars) == ['train/a']
    assert runner.message_hub.log_scalars['train/a'].current() == 3.
    assert processor.custom_cfg == [
        dict(data_src='loss/max', method_name='mean')
    ]
