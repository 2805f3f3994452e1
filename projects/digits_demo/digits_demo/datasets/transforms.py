# Copyright (c) mmstats contributors. All rights reserved.
"""Transforms of the embedded digits pipeline (pure numpy, no OpenCV)."""
import numpy as np
import torch
from mmcv.transforms import BaseTransform

from digits_demo.registry import TRANSFORMS


@TRANSFORMS.register_module()
class RandomShift(BaseTransform):
    """Shift the image by up to ``max_shift`` pixels, padding with zeros.

    Args:
        max_shift (int): Largest shift in each direction. Defaults to 1.
        prob (float): Probability of shifting. Defaults to 0.5.
    """

    def __init__(self, max_shift: int = 1, prob: float = 0.5) -> None:
        if not isinstance(max_shift, int) or max_shift < 0:
            raise ValueError(
                f'max_shift must be an int >= 0, got {max_shift!r}')
        if not 0 <= prob <= 1:
            raise ValueError(f'prob must be in [0, 1], got {prob!r}')
        self.max_shift = max_shift
        self.prob = prob

    def transform(self, results: dict) -> dict:
        if self.max_shift == 0 or np.random.rand() >= self.prob:
            return results
        img = results['img']
        dy, dx = np.random.randint(-self.max_shift, self.max_shift + 1, 2)
        shifted = np.zeros_like(img)
        h, w = img.shape[:2]
        shifted[max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
            img[max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
        results['img'] = shifted
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(max_shift={self.max_shift}, '
                f'prob={self.prob})')


@TRANSFORMS.register_module()
class Normalize(BaseTransform):
    """Normalise the image: ``(img - mean) / std``.

    Args:
        mean (float): Mean subtracted. Defaults to 0.3.
        std (float): Divisor, must be > 0. Defaults to 0.38.
    """

    def __init__(self, mean: float = 0.3, std: float = 0.38) -> None:
        if not std > 0:
            raise ValueError(f'std must be > 0, got {std!r}')
        self.mean = float(mean)
        self.std = float(std)

    def transform(self, results: dict) -> dict:
        results['img'] = ((results['img'] - self.mean) /
                          self.std).astype(np.float32)
        return results


@TRANSFORMS.register_module()
class PackInputs(BaseTransform):
    """Pack a sample as ``dict(inputs=Tensor[C, H, W], data_samples=dict)``.

    ``data_samples`` holds ``gt_label`` and ``img_id`` (the image's index in
    the whole data set, -1 if unknown) as 0-d tensors, so ``default_collate``
    stacks them into a dict of 1-d tensors.
    """

    def transform(self, results: dict) -> dict:
        img = np.ascontiguousarray(results['img'], dtype=np.float32)
        if img.ndim == 2:
            img = img[None]
        data_samples = dict(
            gt_label=torch.tensor(results['gt_label'], dtype=torch.long),
            img_id=torch.tensor(results.get('img_id', -1), dtype=torch.long))
        return dict(inputs=torch.from_numpy(img), data_samples=data_samples)
