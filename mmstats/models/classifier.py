# Copyright (c) mmstats contributors. All rights reserved.
"""The demo image classifier: a backbone and a linear head."""
from typing import Dict, List, Optional, Union

import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from torch import nn

from mmstats.registry import MODELS


@MODELS.register_module()
class ImageClassifier(BaseModel):
    """Backbone + global pooling + linear head, as an mmengine ``BaseModel``.

    ``data_samples`` is a dict with a ``gt_label`` tensor (see
    :class:`mmstats.datasets.PackInputs`).

    Args:
        backbone (dict): Config of the backbone, e.g.
            ``dict(type='ResNetMini')``.
        num_classes (int): Number of classes. Defaults to 10.
        data_preprocessor (dict, optional): Config of the data
            preprocessor. Defaults to ``TensorDataPreprocessor``.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self,
                 backbone: dict,
                 num_classes: int = 10,
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(
                f'num_classes must be an int >= 2, got {num_classes!r}')
        super().__init__(
            data_preprocessor=data_preprocessor
            or dict(type='mmstats.TensorDataPreprocessor'),
            init_cfg=init_cfg)
        self.backbone = MODELS.build(backbone)
        self.head = nn.Linear(self.backbone.out_channels, num_classes)

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
        logits = self.head(self.backbone(inputs))
        if mode == 'tensor':
            return logits
        if mode == 'loss':
            return dict(loss=F.cross_entropy(logits, data_samples['gt_label']))
        if mode == 'predict':
            return self.predict(logits, data_samples)
        raise ValueError(
            f"mode must be 'tensor', 'loss' or 'predict', got {mode!r}")

    @staticmethod
    def predict(logits: torch.Tensor,
                data_samples: Optional[dict]) -> List[dict]:
        """Turn logits into one result dict per sample."""
        scores = logits.softmax(dim=1)
        preds = scores.argmax(dim=1)
        gts = None if data_samples is None else data_samples['gt_label']
        return [
            dict(pred_label=preds[i], score=scores[i],
                 gt_label=None if gts is None else gts[i])
            for i in range(len(preds))
        ]
