# Copyright (c) mmstats contributors. All rights reserved.
"""``python tools/analysis/plot_throughput.py`` runs
:mod:`mmstats.analysis.plot_throughput`, which the wheel installs
(``mmstats-plot WORK_DIR`` draws every figure). ``import plot_throughput``
beside it gives the package's module."""
import sys

from mmstats.analysis import plot_throughput

if __name__ == '__main__':
    plot_throughput.main()
else:  # ``import plot_throughput`` beside it: the package's module itself
    sys.modules[__name__] = plot_throughput
