# Copyright (c) mmstats contributors. All rights reserved.
from .classifier import ImageClassifier
from .data_preprocessor import TensorDataPreprocessor
from .resnet_mini import ResNetMini

__all__ = ['ImageClassifier', 'TensorDataPreprocessor', 'ResNetMini']
