# Copyright (c) mmstats contributors. All rights reserved.
"""The embedded default data: scikit-learn's handwritten digits (no
download)."""
import importlib.util
import os.path as osp
from typing import List, Optional, Sequence, Tuple

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


def load_digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``(images, labels)``: float64 images of
    shape (1797, 8, 8) with values 0..16, and int labels.

    The CSV file is read where scikit-learn installed it, without importing
    scikit-learn (1.3 s of CPU in every process that loads the data: each
    rank of a distributed run); ``sklearn.datasets.load_digits`` where that
    file is not found.

    Example:
        >>> images, labels = load_digits_arrays()
        >>> images.shape, labels[:3].tolist()
        ((1797, 8, 8), [0, 1, 2])
    """
    spec = importlib.util.find_spec('sklearn')
    roots = (spec.submodule_search_locations or []) if spec else []
    for root in roots:
        path = osp.join(root, 'datasets', 'data', 'digits.csv.gz')
        if osp.isfile(path):
            data = np.loadtxt(path, delimiter=',')
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits
    digits = load_digits()
    return digits.images, digits.target


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
        images, labels = load_digits_arrays()
        images = (images / 16.0).astype(np.float32)
        keep = split_indices(
            len(images), self.split, self.val_fraction, self.split_seed)
        return [
            dict(img=images[i], gt_label=int(labels[i]), img_id=int(i))
            for i in keep
        ]
