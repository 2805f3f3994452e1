"""``mmstats.launch.checkpoints``: after ``allow_mmengine_checkpoints`` a
checkpoint holding mmengine's own objects loads with the Runner's plain
``torch.load(weights_only=True)``."""
import io

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer

from mmstats.launch.checkpoints import allow_mmengine_checkpoints
from tests.helpers.torch_versions import torch_at_least


@pytest.mark.skipif(
    not torch_at_least('2.4'), reason='add_safe_globals is torch >= 2.4')
def test_mmengine_objects_load_with_weights_only():
    allow_mmengine_checkpoints()
    # what a config's custom_imports does (idempotent: allowed already)
    from mmstats.launch import allow_checkpoints  # noqa: F401
    buffer = HistoryBuffer()
    buffer.update(1.5)
    blob = io.BytesIO()
    torch.save(dict(hub=buffer, step=np.int64(3)), blob)
    blob.seek(0)
    loaded = torch.load(blob, weights_only=True)
    assert loaded['hub'].current() == 1.5 and loaded['step'] == 3
