# Copyright (c) mmstats contributors. All rights reserved.
"""``import figures`` in ``tools/analysis``: :mod:`mmstats.analysis.figures`
(what the plot tools share), which the wheel installs."""
import sys

from mmstats.analysis import figures

sys.modules[__name__] = figures  # ``import figures`` beside it
