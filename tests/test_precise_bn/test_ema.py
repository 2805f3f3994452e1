"""The EMA copy beside the model (``precise_bn/ema.py``) without a Runner:
the BN statistics swap restores exactly, the mode mirror copies the modes
and nothing else."""
import copy

import pytest
import torch
from torch import nn

from mmstats.precise_bn import BN_STATISTICS, mirror_modes, swap_bn_statistics


def _model() -> nn.Module:
    """BN layers of three kinds, one without running statistics, and a
    norm with running statistics that is not BatchNorm."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 5),
        nn.BatchNorm1d(5), nn.BatchNorm1d(5, track_running_stats=False),
        nn.InstanceNorm1d(5, track_running_stats=True))


def _randomised(seed: int) -> nn.Module:
    """``_model()`` with every parameter and buffer drawn from ``seed``."""
    torch.manual_seed(seed)
    model = _model()
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(torch.rand_like(tensor) + 0.5)
            else:
                tensor.fill_(seed + 3)
    return model


def _state(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_equal_states(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0)


def _is_bn_statistic(key: str, model: nn.Module) -> bool:
    name, _, buffer = key.rpartition('.')
    layer = model.get_submodule(name)
    return (isinstance(layer, nn.modules.batchnorm._BatchNorm)
            and layer.track_running_stats and buffer in BN_STATISTICS)


def test_swap_exchanges_the_bn_statistics_and_nothing_else():
    a, b = _randomised(0), _randomised(1)
    a_before, b_before = _state(a), _state(b)
    swap_bn_statistics(a, b)
    a_after, b_after = _state(a), _state(b)
    swapped = [k for k in a_before if _is_bn_statistic(k, a)]
    assert swapped == [
        '1.running_mean', '1.running_var', '4.running_mean', '4.running_var'
    ]
    for key in a_before:  # num_batches_tracked, InstanceNorm: stay
        a_want, b_want = ((b_before[key], a_before[key]) if key in swapped else
                          (a_before[key], b_before[key]))
        torch.testing.assert_close(a_after[key], a_want, rtol=0, atol=0)
        torch.testing.assert_close(b_after[key], b_want, rtol=0, atol=0)


def test_a_second_swap_restores_both_models_exactly():
    a, b = _randomised(0), _randomised(1)
    b.eval()
    a_before, b_before = _state(a), _state(b)
    objects = [id(t) for t in list(a.buffers()) + list(b.buffers())]
    swap_bn_statistics(a, b)
    swap_bn_statistics(a, b)
    _assert_equal_states(_state(a), a_before)
    _assert_equal_states(_state(b), b_before)
    # the buffer objects never moved (references held elsewhere stay live)
    assert [id(t) for t in list(a.buffers()) + list(b.buffers())] == objects
    assert all(m.training for m in a.modules())
    assert not any(m.training for m in b.modules())


def test_swap_works_on_buffers_that_require_no_grad_under_autograd():
    a, b = _randomised(0), _randomised(1)
    with torch.enable_grad():
        swap_bn_statistics(a, b)
    assert not a[1].running_mean.requires_grad


def _modes(model: nn.Module) -> list:
    return [m.training for m in model.modules()]


def test_mirror_copies_the_modes_and_nothing_else():
    model = _randomised(0)
    model[1].eval()  # a frozen stage (norm_eval)
    model[5].eval()
    ema = copy.deepcopy(_randomised(1)).eval()
    ema[4].train()  # modes of an earlier moment
    model_state, ema_state = _state(model), _state(ema)
    model_modes, ema_modes = _modes(model), _modes(ema)
    with mirror_modes(ema, model):
        assert _modes(ema) == model_modes
        _assert_equal_states(_state(ema), ema_state)  # values untouched
        _assert_equal_states(_state(model), model_state)
        assert _modes(model) == model_modes
    assert _modes(ema) == ema_modes
    _assert_equal_states(_state(ema), ema_state)


def test_mirror_restores_the_modes_when_the_body_raises():
    model, ema = _model(), _model().eval()
    with pytest.raises(RuntimeError, match='forward failed'):
        with mirror_modes(ema, model):
            assert all(_modes(ema))
            raise RuntimeError('forward failed')
    assert not any(_modes(ema))
