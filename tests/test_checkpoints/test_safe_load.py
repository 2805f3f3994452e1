"""``mmstats.checkpoints.safe_load``: mmengine's objects load under
``torch.load(weights_only=True)`` with the list allowed for one call only;
the pickle's ``getattr`` reaches only the attributes it allows."""
import pickle
import subprocess
import sys

import pytest
from mmengine.logging import HistoryBuffer

from mmstats.checkpoints.safe_load import (checkpoint_getattr,
                                           load_checkpoint_file,
                                           mmengine_checkpoint_globals)
from tests.helpers.torch_versions import torch_at_least

# a fresh process (torch's allowlist is process-wide, and other tests of
# this session may have filled it): a checkpoint holding a HistoryBuffer
# and a numpy scalar, read by load_checkpoint_file, then by plain
# torch.load; prints what each gave and how the allowlist grew
SCRIPT = """
import io, numpy as np, torch
from mmengine.logging import HistoryBuffer
from mmstats.checkpoints.safe_load import load_checkpoint_file
buffer = HistoryBuffer()
buffer.update(1.5)
blob = io.BytesIO()
torch.save(dict(hub=buffer, step=np.int64(3)), blob)
blob.seek(0)
before = len(torch.serialization.get_safe_globals())
loaded = load_checkpoint_file(blob)
print('scoped', loaded['hub'].current(), int(loaded['step']))
print('allowlist grew', len(torch.serialization.get_safe_globals()) - before)
blob.seek(0)
try:
    torch.load(blob)
    print('plain loaded')
except Exception as e:
    print('plain refused', type(e).__name__)
"""


@pytest.mark.skipif(
    not torch_at_least('2.6'),
    reason='weights_only is torch.load\'s default from torch 2.6')
def test_a_read_allows_mmengines_objects_for_itself_only():
    out = subprocess.run([sys.executable, '-c', SCRIPT],
                         capture_output=True,
                         text=True,
                         check=True).stdout.split('\n')
    assert out[:3] == [
        'scoped 1.5 3', 'allowlist grew 0', 'plain refused UnpicklingError'
    ]


def test_the_list_holds_mmengines_classes_from_torch_2_6():
    allowed = mmengine_checkpoint_globals()
    if torch_at_least('2.6'):
        assert HistoryBuffer in allowed
        assert (checkpoint_getattr, 'builtins.getattr') in allowed
    else:
        assert allowed == []


def test_a_file_loads_on_the_cpu(tmp_path):
    import torch
    buffer = HistoryBuffer()
    buffer.update(2.0)
    torch.save(dict(hub=buffer, w=torch.ones(2)), tmp_path / 'c.pth')
    loaded = load_checkpoint_file(str(tmp_path / 'c.pth'))
    assert loaded['hub'].current() == 2.0
    assert loaded['w'].device.type == 'cpu'


def test_the_pickles_getattr_reaches_only_what_it_allows():
    assert checkpoint_getattr(HistoryBuffer, 'mean') is HistoryBuffer.mean
    with pytest.raises(pickle.UnpicklingError):
        checkpoint_getattr(HistoryBuffer, '__init__')
