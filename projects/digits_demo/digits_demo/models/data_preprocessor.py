# Copyright (c) mmstats contributors. All rights reserved.
import torch
from mmengine.model import BaseDataPreprocessor

from digits_demo.registry import MODELS


@MODELS.register_module()
class TensorDataPreprocessor(BaseDataPreprocessor):
    """Move a batch to the model's device and stack lists of inputs.

    Accepts batches from ``default_collate`` (``inputs`` is a tensor) and
    from mmengine's default ``pseudo_collate`` (lists of tensors/dicts).
    """

    def forward(self, data: dict, training: bool = False) -> dict:
        data = self.cast_data(data)
        inputs = data['inputs']
        if isinstance(inputs, (list, tuple)):
            inputs = torch.stack(inputs)
        samples = data.get('data_samples')
        if isinstance(samples, (list, tuple)) and samples and isinstance(
                samples[0], dict):
            samples = {
                key: torch.stack([s[key] for s in samples])
                for key in samples[0]
            }
        return dict(inputs=inputs, data_samples=samples)
