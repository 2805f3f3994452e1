"""The same argument mistake gets the same answer from every public entry
point: a wrong type is a TypeError, a wrong value a ValueError, and the
message names the owner, the argument, what it must be and what was given
(``mmstats.utils.args``). Before issue 29 ``Collector(max_names=True)``
raised TypeError where ``StatsCollectorHook(max_names=True)`` raised
ValueError."""
import re

import pytest
import torch.nn as nn

from mmstats import Collector, training_stats, update_bn_stats
from mmstats.hooks import ModuleStatsHook, PreciseBNHook, StatsCollectorHook
from mmstats.utils import args


def bn_stats(**kwargs):
    kwargs.setdefault('num_samples', 8)
    kwargs.setdefault('progress', False)
    update_bn_stats(nn.BatchNorm1d(2), [], **kwargs)


OWNERS = {
    'Collector': Collector,
    'StatsCollectorHook': StatsCollectorHook,
    'PreciseBNHook': PreciseBNHook,
    'update_bn_stats': bn_stats,
    'training_stats.Collector': training_stats.Collector,
    'ModuleStatsHook': lambda **kw: ModuleStatsHook(**{
        'modules': 'x',
        **kw
    }),
}

# (owner, argument, a wrong value, the exception, what the message says)
CASES = [
    # flags: types are checked, not truthiness
    *[(owner, name, bad, TypeError, 'must be True or False')
      for owner, name in (('Collector', 'keep_previous'),
                          ('Collector', 'sketch'),
                          ('StatsCollectorHook', 'keep_previous'),
                          ('StatsCollectorHook', 'by_epoch'),
                          ('PreciseBNHook', 'at_end'),
                          ('update_bn_stats', 'progress'),
                          ('training_stats.Collector', 'keep_previous'))
      for bad in (1, None, 'yes')],
    # positive ints
    *[(owner, name, bad, error, 'a positive int')
      for owner, name in (('Collector', 'max_names'),
                          ('Collector', 'evict_after'),
                          ('StatsCollectorHook', 'max_names'),
                          ('StatsCollectorHook', 'interval'),
                          ('PreciseBNHook', 'num_samples'),
                          ('PreciseBNHook', 'interval'),
                          ('update_bn_stats', 'num_samples'))
      for bad, error in ((True, TypeError), (2.5, TypeError), ('8', TypeError),
                         (0, ValueError), (-1, ValueError))],
    # regular expressions
    *[(owner, 'regex', bad, error, what)
      for owner in ('Collector', 'StatsCollectorHook',
                    'training_stats.Collector')
      for bad, error, what in ((None, TypeError, 'must be a str'),
                               (3, TypeError, 'must be a str'),
                               ('(', ValueError, 'is not a valid regular'))],
    # one of a few strings
    *[(owner, name, bad, error, 'must be one of')
      for owner, name in (('StatsCollectorHook', 'on_nonfinite'),
                          ('PreciseBNHook', 'estimator'),
                          ('update_bn_stats', 'estimator'))
      for bad, error in (('nope', ValueError), (None, TypeError))],
    # ModuleStatsHook's statistics and prefix
    *[('ModuleStatsHook', 'stats', bad, error, 'must be a non-empty list')
      for bad, error in (('act', TypeError), (None, TypeError),
                         ((), ValueError), (('typo', ), ValueError))],
    *[('ModuleStatsHook', 'prefix', bad, error, 'must be a non-empty str')
      for bad, error in ((1, TypeError), ('', ValueError))],
]


@pytest.mark.parametrize(
    'owner, name, bad, error, what',
    CASES,
    ids=[f'{c[0]}-{c[1]}-{c[2]!r}' for c in CASES])
def test_the_same_mistake_gets_the_same_answer(owner, name, bad, error, what):
    with pytest.raises(Exception) as info:
        OWNERS[owner](**{name: bad})
    assert type(info.value) is error, (type(info.value), str(info.value))
    message = str(info.value)
    assert message.startswith(f'{owner}: {name} '), message
    assert what in message and repr(bad) in message, message
    if error is TypeError and what != 'must be a str':
        assert f'of type {type(bad).__name__}' in message, message


def test_messages_say_the_fix():
    with pytest.raises(TypeError) as flag:
        args.check_bool('X', 'keep', 1)
    assert str(flag.value) == ('X: keep must be True or False, got 1 of type '
                               'int; write keep=True or keep=False')
    with pytest.raises(ValueError) as number:
        args.check_positive_int('X', 'n', 0, example=8)
    assert str(number.value) == 'X: n must be a positive int (e.g. n=8), got 0'
    with pytest.raises(ValueError, match=re.escape("X: r '(' is not a valid")):
        args.compile_regex('X', 'r', '(')
    assert args.check_positive_int('X', 'n', None, none_ok=True) is None
    assert args.check_bool('X', 'b', None, none_ok=True) is None
