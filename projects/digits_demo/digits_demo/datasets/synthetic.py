# Copyright (c) mmstats contributors. All rights reserved.
"""A small synthetic digits-like dataset for fast tests."""
from typing import List, Optional, Sequence

import numpy as np
from mmengine.dataset import BaseDataset

from digits_demo.registry import DATASETS
from .digits import check_split_args, split_indices


@DATASETS.register_module()
class SyntheticDigitsDataset(BaseDataset):
    """Deterministic 8x8 images: one class-specific template plus noise.

    Same sample format as :class:`DigitsDataset`, built in milliseconds.

    Args:
        num_samples (int): Number of images in all splits. Defaults to 256.
        num_classes (int): Number of classes. Defaults to 10.
        noise (float): Std of the Gaussian noise added to the templates.
            Defaults to 0.3.
        seed (int): Seed of templates and noise. Defaults to 0.
        split (str): ``'train'``, ``'val'`` or ``'all'``. Defaults to
            ``'train'``.
        val_fraction (float): Share of the images in the val split.
            Defaults to 0.2.
        split_seed (int): Seed of the train/val permutation. Defaults to 0.
        pipeline (list): Transforms applied to each sample. Defaults to [].
        **kwargs: Other arguments of :class:`mmengine.dataset.BaseDataset`.
    """

    METAINFO = dict(classes=tuple(str(i) for i in range(10)))

    def __init__(self,
                 num_samples: int = 256,
                 num_classes: int = 10,
                 noise: float = 0.3,
                 seed: int = 0,
                 split: str = 'train',
                 val_fraction: float = 0.2,
                 split_seed: int = 0,
                 pipeline: Optional[Sequence] = None,
                 **kwargs) -> None:
        check_split_args(split, val_fraction)
        if not isinstance(num_samples, int) or num_samples < 2:
            raise ValueError(
                f'num_samples must be an int >= 2, got {num_samples!r}')
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(
                f'num_classes must be an int >= 2, got {num_classes!r}')
        self.num_samples = num_samples
        self.num_classes = num_classes
        self.noise = noise
        self.seed = seed
        self.split = split
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        super().__init__(pipeline=pipeline or [], **kwargs)

    def load_data_list(self) -> List[dict]:
        rng = np.random.RandomState(self.seed)
        templates = rng.rand(self.num_classes, 8, 8)
        labels = np.arange(self.num_samples) % self.num_classes
        images = templates[labels] + self.noise * rng.randn(
            self.num_samples, 8, 8)
        keep = split_indices(self.num_samples, self.split, self.val_fraction,
                             self.split_seed)
        return [
            dict(
                img=images[i].astype(np.float32),
                gt_label=int(labels[i]),
                img_id=int(i)) for i in keep
        ]
