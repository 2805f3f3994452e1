"""Sketch counts pending in a collector add up over several flushes (every
other collector's update() flushes the store)."""
import numpy as np

from mmstats.stats import Collector, report


def test_counts_add_up_over_flushes():
    mine = Collector('x', sketch=True)
    other = Collector('y')
    report('x', [1.0, 2.0])
    other.update()  # flushes: 'x' waits in ``mine``
    report('x', [100.0, 200.0, 300.0])
    other.update()  # a second flush before ``mine`` publishes
    mine.update()
    assert mine.num('x') == 5
    # the median of all five values, not of the last flush's three
    assert abs(mine.quantile('x', 0.5) - 100.0) <= 1.0
    assert abs(mine.quantile('x', 0.0) - 1.0) <= 0.01
    assert np.isclose(mine.mean('x'), 120.6)
