# Copyright (c) mmstats contributors. All rights reserved.
"""The embedded default data: scikit-learn's handwritten digits (no
download)."""
from typing import List, Optional, Sequence

import numpy as np
from mmengine.dataset import BaseDataset

from digits_demo.registry import DATASETS

SPLITS = ('train', 'val', 'all')


def check_split_args(split: str, val_fraction: float) -> None:
    """Validate the arguments shared by the embedded datasets."""
    if split not in SPLITS:
        raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
    if not 0 < val_fraction < 1:
        raise ValueError('val_fraction must be in (0, 1), e.g. 0.2, got '
                         f'{val_fraction!r}')


def split_indices(num: int, split: str, val_fraction: float,
                  split_seed: int) -> np.ndarray:
    """Indices of ``split`` in a seeded permutation of ``range(num)``.

    The same ``split_seed`` gives the same disjoint train/val split on every
    machine and every rank.
    """
    order = np.random.RandomState(split_seed).permutation(num)
    num_val = int(round(num * val_fraction))
    if split == 'val':
        return np.sort(order[:num_val])
    if split == 'train':
        return np.sort(order[num_val:])
    return np.arange(num)


@DATASETS.register_module()
class DigitsDataset(BaseDataset):
    """scikit-learn's handwritten digits: 1797 8x8 grey images, 10 classes.

    The data ship inside scikit-learn (``sklearn.datasets.load_digits``), so
    nothing is downloaded. Pixel values are scaled from 0..16 to 0..1.

    Args:
        split (str): ``'train'``, ``'val'`` or ``'all'``. Defaults to
            ``'train'``.
        val_fraction (float): Share of the images in the val split.
            Defaults to 0.2.
        split_seed (int): Seed of the train/val permutation. Defaults to 0.
        pipeline (list): Transforms applied to each sample. Defaults to [].
        **kwargs: Other arguments of :class:`mmengine.dataset.BaseDataset`
            (``indices``, ``serialize_data``, ``test_mode``...).
    """

    METAINFO = dict(classes=tuple(str(i) for i in range(10)))

    def __init__(self,
                 split: str = 'train',
                 val_fraction: float = 0.2,
                 split_seed: int = 0,
                 pipeline: Optional[Sequence] = None,
                 **kwargs) -> None:
        check_split_args(split, val_fraction)
        self.split = split
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        super().__init__(pipeline=pipeline or [], **kwargs)

    def load_data_list(self) -> List[dict]:
        from sklearn.datasets import load_digits
        digits = load_digits()
        images = (digits.images / 16.0).astype(np.float32)
        keep = split_indices(
            len(images), self.split, self.val_fraction, self.split_seed)
        return [
            dict(img=images[i], gt_label=int(digits.target[i]), img_id=int(i))
            for i in keep
        ]
