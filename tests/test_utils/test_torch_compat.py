"""Both branches of each API in mmstats/utils/torch_compat.py: the one the
installed torch takes, and the older torch's, forced here, giving the same
result (the version matrix runs the real old torch: docs/compat.md)."""
import pytest
import torch

from mmstats.utils import torch_compat
from mmstats.utils.torch_compat import (aminmax, flop_registry, foreach_norm,
                                        register_fake, register_step_hooks,
                                        require_torch, torch_at_least)


class UnhookedSGD(torch.optim.Optimizer):
    """Plain SGD whose class ``step`` runs no step hooks although it is
    marked as patched: what torch 2.1's optimizers are after ``import
    deepspeed``."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group['params']:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group['lr'])


UnhookedSGD.step.hooked = True  # torch's mark: "patched already"


def _step_once(optimizer, model):
    optimizer.zero_grad()
    model(torch.ones(3)).sum().backward()
    optimizer.step()


@pytest.mark.parametrize('cls', [torch.optim.SGD, UnhookedSGD])
def test_step_hooks_run_whatever_the_class_does(cls):
    model = torch.nn.Linear(3, 1)
    optimizer = cls(model.parameters(), lr=0.1)
    calls = []
    handles = register_step_hooks(
        optimizer, lambda opt, args, kwargs: calls.append(('pre', opt)),
        lambda opt, args, kwargs: calls.append(('post', opt)))
    before = model.weight.detach().clone()
    _step_once(optimizer, model)
    assert calls == [('pre', optimizer), ('post', optimizer)]
    assert not torch.equal(model.weight, before)  # it did step
    for handle in handles:
        handle.remove()
    _step_once(optimizer, model)
    assert len(calls) == 2
    assert 'step' not in vars(optimizer)  # the class's step again


def test_the_wrapped_step_keeps_a_schedulers_wrap_and_restores_it():
    model = torch.nn.Linear(3, 1)
    optimizer = UnhookedSGD(model.parameters(), lr=0.1)
    counted = []
    inner = optimizer.step

    def with_counter(*args, **kwargs):  # what mmengine's schedulers do
        counted.append(1)
        return inner(*args, **kwargs)

    with_counter._with_counter = True
    optimizer.step = with_counter
    calls = []
    [handle] = register_step_hooks(optimizer, lambda *a: calls.append('pre'),
                                   lambda *a: calls.append('post'))
    assert optimizer.step._with_counter  # the mark schedulers check
    _step_once(optimizer, model)
    assert calls == ['pre', 'post'] and counted == [1]
    handle.remove()
    assert optimizer.step is with_counter


@pytest.mark.parametrize('dtype', [None, torch.float64, torch.float32])
def test_foreach_norm_without_the_dtype_argument(monkeypatch, dtype):
    tensors = [torch.randn(5, dtype=torch.float16), torch.randn(3, 2).half()]
    new = foreach_norm(tensors, 2, dtype)
    monkeypatch.setattr(torch_compat, '_FOREACH_NORM_DTYPE', False)
    old = foreach_norm(tensors, 2, dtype)
    assert [n.dtype for n in new] == [n.dtype for n in old]
    assert all(torch.equal(a, b) for a, b in zip(new, old))


def test_cpu_half_aminmax_in_float32(monkeypatch):
    values = torch.tensor([3., -65504., 0.5, 65504.], dtype=torch.float16)
    monkeypatch.setattr(torch_compat, '_HALF_AMINMAX_MISSING', True)
    low, high = aminmax(values)
    assert (low.dtype, low.item(), high.item()) == (torch.float16, -65504.,
                                                    65504.)


def test_torch_2_1_flop_formulas_of_shapes_are_called_with_tensors():

    class Torch21Counter:  # FlopCounterMode before 2.2: formulas of shapes
        flop_mapping = {
            torch.ops.aten.mm:
            lambda a_shape, b_shape, out_shape=None:
            (a_shape, b_shape, out_shape)
        }

    registry = flop_registry(Torch21Counter())
    a, b = torch.ones(2, 3), torch.ones(3, 4)
    assert registry[torch.ops.aten.mm](
        a, b, out_val=a @ b) == (torch.Size([2, 3]), torch.Size([3, 4]),
                                 torch.Size([2, 4]))


def test_a_fake_kernel_without_register_fake(monkeypatch):
    monkeypatch.delattr(torch.library, 'register_fake', raising=False)
    monkeypatch.delattr(torch.library, 'impl_abstract', raising=False)
    lib = torch.library.Library('mmstats_compat_test', 'DEF')
    lib.define('double(Tensor x) -> Tensor')
    lib.impl('double', lambda x: x * 2, 'CPU')
    register_fake('mmstats_compat_test::double', lambda x: torch.empty_like(x),
                  lib)
    assert torch.ops.mmstats_compat_test.double(
        torch.ones(2)).tolist() == [2., 2.]
    meta = torch.ops.mmstats_compat_test.double(torch.ones(2, device='meta'))
    assert meta.device.type == 'meta' and meta.shape == (2, )


def test_a_feature_refuses_naming_the_torch_it_needs():
    require_torch('2.1', 'anything')
    with pytest.raises(
            RuntimeError, match=r'FSDP2 needs torch >= 99\.0 \(found '):
        require_torch('99.0', 'FSDP2')
    assert torch_at_least('2.1') and not torch_at_least('99')


def test_fsdp2_on_the_cpu_refuses_a_torch_before_2_6(monkeypatch):
    """torch < 2.6's fully_shard uses CUDA streams: on a machine without
    CUDA, FSDP2Strategy refuses at build, naming the torch it needs (torch
    2.4.1 trained until the first forward, then died in "CUDA driver
    version is insufficient")."""
    from mmstats.strategies import FSDP2Strategy
    from mmstats.utils import torch_compat
    monkeypatch.setattr(torch_compat, 'torch_at_least',
                        lambda version: version != '2.6')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(
            RuntimeError,
            match=r'mmstats\.FSDP2Strategy '
            r'\(fully_shard\) on the CPU needs torch >= 2\.6'):
        FSDP2Strategy()
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    torch_compat.require_cpu_fully_shard('FSDP2')  # GPUs: torch 2.4 works
