"""A toy BN classifier, its dataset and metric for real-Runner tests.

Not the demo: core tests must not depend on ``projects/digits_demo``. The
classes are registered (test-only, ``force=True``) in mmengine's root
registries, so configs name them with strings and stay printable. The
names mirror a real backbone (``backbone.stem.conv`` then
``backbone.stem.bn``: a bias-free conv, so the stem BN's population
statistics have a closed form over the dataset's inputs).
"""
from typing import List, Optional

import torch
import torch.nn.functional as F
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, METRICS, MODELS
from torch import nn
from torch.utils.data import Dataset

from mmstats import report


@DATASETS.register_module(force=True)
class ToyDataset(Dataset):
    """``num_samples`` deterministic 1x8x8 images of 10 classes.

    A sample is ``dict(inputs=Tensor(1, 8, 8), data_samples=dict(
    gt_label=int, img_id=int))``; ``default_collate`` batches it.

    Args:
        num_samples (int): Number of samples. Defaults to 160.
        seed (int): Seed of templates and noise. Defaults to 0.
        report_name (str, optional): If set, ``__getitem__`` reports the
            sample index under this name. Defaults to None.
    """

    def __init__(self,
                 num_samples: int = 160,
                 seed: int = 0,
                 report_name: Optional[str] = None) -> None:
        gen = torch.Generator().manual_seed(seed)
        templates = torch.rand(10, 1, 8, 8, generator=gen)
        self.labels = torch.arange(num_samples) % 10
        self.images = templates[self.labels] + 0.3 * torch.randn(
            num_samples, 1, 8, 8, generator=gen)
        self.report_name = report_name

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> dict:
        if self.report_name:
            report(self.report_name, float(idx))
        return dict(
            inputs=self.images[idx],
            data_samples=dict(gt_label=int(self.labels[idx]), img_id=int(idx)))


class ToyStem(nn.Module):

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class ToyBackbone(nn.Module):

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.stem = ToyStem(channels)
        self.layer1 = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer1(self.stem(x))


@MODELS.register_module(force=True)
class ToyBNModel(BaseModel):
    """Conv+BN backbone, global pooling and a linear head.

    Args:
        channels (int): Width of the backbone. Defaults to 8.
        report_stats (bool): Report ``model/feat_norm`` (one value per
            sample) in every mode, like a user's model would. Defaults to
            False.
    """

    def __init__(self,
                 channels: int = 8,
                 report_stats: bool = False,
                 data_preprocessor: Optional[dict] = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.backbone = ToyBackbone(channels)
        self.head = nn.Linear(channels, 10)
        self.report_stats = report_stats

    def forward(self,
                inputs: torch.Tensor,
                data_samples: Optional[dict] = None,
                mode: str = 'tensor'):
        feats = self.backbone(inputs).mean(dim=(2, 3))
        if self.report_stats:
            report('model/feat_norm', feats.detach().norm(dim=1))
        logits = self.head(feats)
        if mode == 'tensor':
            return logits
        labels = data_samples['gt_label']
        if mode == 'loss':
            return dict(loss=F.cross_entropy(logits, labels))
        return [dict(pred=p, gt=g) for p, g in zip(logits.argmax(1), labels)]


@METRICS.register_module(force=True)
class ToyAccuracy(BaseMetric):
    """Top-1 accuracy in percent (key ``accuracy``)."""

    def process(self, data_batch, data_samples: List[dict]) -> None:
        self.results += [float(s['pred'] == s['gt']) for s in data_samples]

    def compute_metrics(self, results: list) -> dict:
        return dict(accuracy=100 * sum(results) / max(len(results), 1))


def toy_flops_per_sample(channels: int = 8, side: int = 8) -> int:
    """The toy model's FLOPs per sample by hand (2 per multiply-add):
    forward of conv 1->C, conv C->C (3x3, same padding) and the C->10
    head; backward: both gradients of the second conv and of the head,
    the weight gradient only of the first conv (its input needs none)."""
    pixels = side * side
    conv1 = 2 * pixels * channels * 1 * 9
    conv2 = 2 * pixels * channels * channels * 9
    head = 2 * channels * 10
    return (conv1 + conv2 + head) + (conv1 + 2 * conv2 + 2 * head)
