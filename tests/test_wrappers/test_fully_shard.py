"""FullyShard's refusals, before it shards anything (the sharded runs are
in ``tests/test_sharded.py``): built outside FSDP2Strategy, or with a
``blocks`` pattern that matches no module."""
import pytest
from torch import nn

from mmstats.registry import MODEL_WRAPPERS
from mmstats.wrappers import FullyShard
from tests.helpers.torch_versions import needs_torch

# before torch 2.4 FullyShard is refused first for the torch it needs
# (tests/test_utils/test_torch_compat.py)
pytestmark = needs_torch('2.4', "FSDP2's API (mmstats.FullyShard)")


def test_outside_fsdp2_strategy_it_is_refused():
    with pytest.raises(ValueError, match='FSDP2Strategy'):
        MODEL_WRAPPERS.build(
            dict(
                type='mmstats.FullyShard', module=nn.Linear(2, 2),
                blocks='.*'))


def test_blocks_that_match_no_module_are_refused():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with pytest.raises(ValueError, match='matches no module name'):
        FullyShard(model, blocks='backbone', strategy='FSDP2Strategy')
