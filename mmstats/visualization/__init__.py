# Copyright (c) mmstats contributors. All rights reserved.
from .plot import load_scalars, plot_training_curves

__all__ = ['load_scalars', 'plot_training_curves']
