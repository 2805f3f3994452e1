# Copyright (c) mmstats contributors. All rights reserved.
"""``python tools/analysis/plot_stats.py`` runs
:mod:`mmstats.analysis.plot_stats`, which the wheel installs
(``mmstats-plot WORK_DIR`` draws every figure). ``import plot_stats``
beside it gives the package's module."""
import sys

from mmstats.analysis import plot_stats

if __name__ == '__main__':
    plot_stats.main()
else:  # ``import plot_stats`` beside it: the package's module itself
    sys.modules[__name__] = plot_stats
