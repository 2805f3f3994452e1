# Copyright (c) mmstats contributors. All rights reserved.
"""``python tools/analysis/plot_histograms.py`` runs
:mod:`mmstats.analysis.plot_histograms`, which the wheel installs
(``mmstats-plot WORK_DIR`` draws every figure). ``import plot_histograms``
beside it gives the package's module."""
import sys

from mmstats.analysis import plot_histograms

if __name__ == '__main__':
    plot_histograms.main()
else:  # ``import plot_histograms`` beside it: the package's module itself
    sys.modules[__name__] = plot_histograms
