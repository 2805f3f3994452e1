# Copyright (c) mmstats contributors. All rights reserved.
from .digits import DigitsDataset
from .synthetic import SyntheticDigitsDataset
from .transforms import Normalize, PackInputs, RandomShift

__all__ = [
    'DigitsDataset', 'SyntheticDigitsDataset', 'Normalize', 'PackInputs',
    'RandomShift'
]
