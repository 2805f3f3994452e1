# Copyright (c) mmstats contributors. All rights reserved.
from .accuracy import Accuracy

__all__ = ['Accuracy']
