# Copyright (c) mmstats contributors. All rights reserved.
from typing import Dict, List, Sequence

from mmengine.evaluator import BaseMetric

from digits_demo.registry import METRICS


@METRICS.register_module()
class Accuracy(BaseMetric):
    """Top-1 accuracy in percent over all ranks' samples.

    Reads the ``pred_label`` and ``gt_label`` of each prediction of
    :class:`digits_demo.models.ImageClassifier`.
    """

    # metric keys stay 'accuracy' ('' rather than None: no prefix, and no
    # warning from BaseMetric about a missing one)
    default_prefix = ''

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            self.results.append(
                int(sample['pred_label']) == int(sample['gt_label']))

    def compute_metrics(self, results: List[bool]) -> Dict[str, float]:
        return dict(accuracy=100.0 * sum(results) / len(results))
