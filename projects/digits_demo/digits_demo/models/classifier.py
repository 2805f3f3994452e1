# Copyright (c) mmstats contributors. All rights reserved.
"""The demo image classifier: a backbone and a linear head."""
from typing import Dict, List, Optional, Union

import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from torch import nn

from digits_demo.registry import MODELS
from mmstats import report


@MODELS.register_module()
class ImageClassifier(BaseModel):
    """Backbone + global pooling + linear head, as an mmengine ``BaseModel``.

    ``data_samples`` is a dict with a ``gt_label`` tensor (see
    :class:`digits_demo.datasets.PackInputs`).

    Args:
        backbone (dict): Config of the backbone, e.g.
            ``dict(type='ResNetMini')``.
        num_classes (int): Number of classes. Defaults to 10.
        data_preprocessor (dict, optional): Config of the data
            preprocessor. Defaults to ``TensorDataPreprocessor``.
        report_stats (bool): Report internal statistics from ``forward`` in
            ``'loss'`` and ``'predict'`` modes with :func:`mmstats.report`
            (``model/feat_norm``, ``model/logit_margin``,
            ``model/confidence``, ``model/p_true``): cheap, no GPU sync.
            Defaults to False.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self,
                 backbone: dict,
                 num_classes: int = 10,
                 data_preprocessor: Optional[dict] = None,
                 report_stats: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(
                f'num_classes must be an int >= 2, got {num_classes!r}')
        super().__init__(
            data_preprocessor=data_preprocessor
            or dict(type='digits_demo.TensorDataPreprocessor'),
            init_cfg=init_cfg)
        self.backbone = MODELS.build(backbone)
        self.head = nn.Linear(self.backbone.out_channels, num_classes)
        self.report_stats = report_stats

    def forward(self,
                inputs: torch.Tensor,
                data_samples: Optional[dict] = None,
                mode: str = 'tensor') -> Union[torch.Tensor, Dict, List]:
        """Run the model in one of mmengine's modes.

        Args:
            inputs (Tensor): Images, shape (N, C, H, W).
            data_samples (dict, optional): ``gt_label`` (and ``img_id``)
                tensors of shape (N, ). Needed by ``'loss'``.
            mode (str): ``'tensor'`` returns the logits, ``'loss'`` a dict of
                losses, ``'predict'`` a list of per-sample dicts with
                ``pred_label``, ``score`` and ``gt_label``. Defaults to
                ``'tensor'``.
        """
        feats = self.backbone(inputs)
        logits = self.head(feats)
        if mode == 'tensor':
            return logits
        if self.report_stats:
            self._report(feats, logits, data_samples)
        if mode == 'loss':
            return dict(loss=F.cross_entropy(logits, data_samples['gt_label']))
        if mode == 'predict':
            return self.predict(logits, data_samples)
        raise ValueError(
            f"mode must be 'tensor', 'loss' or 'predict', got {mode!r}")

    @staticmethod
    def _report(feats: torch.Tensor, logits: torch.Tensor,
                data_samples: Optional[dict]) -> None:
        """Per-sample statistics of this batch, for StatsCollectorHook."""
        feats, logits = feats.detach(), logits.detach()
        probs = logits.softmax(dim=1)
        top2 = logits.topk(2, dim=1).values
        report('model/feat_norm', feats.norm(dim=1))
        report('model/logit_margin', top2[:, 0] - top2[:, 1])
        report('model/confidence', probs.amax(dim=1))
        if data_samples is not None and 'gt_label' in data_samples:
            labels = data_samples['gt_label'][:, None]
            report('model/p_true', probs.gather(1, labels))

    @staticmethod
    def predict(logits: torch.Tensor,
                data_samples: Optional[dict]) -> List[dict]:
        """Turn logits into one result dict per sample."""
        scores = logits.softmax(dim=1)
        preds = scores.argmax(dim=1)
        gts = None if data_samples is None else data_samples['gt_label']
        return [
            dict(
                pred_label=preds[i],
                score=scores[i],
                gt_label=None if gts is None else gts[i])
            for i in range(len(preds))
        ]
