# Copyright (c) mmstats contributors. All rights reserved.
"""``python tools/analysis/plot_curves.py`` runs
:mod:`mmstats.analysis.plot_curves`, which the wheel installs
(``mmstats-plot WORK_DIR`` draws every figure). ``import plot_curves``
beside it gives the package's module."""
import sys

from mmstats.analysis import plot_curves

if __name__ == '__main__':
    plot_curves.main()
else:  # ``import plot_curves`` beside it: the package's module itself
    sys.modules[__name__] = plot_curves
