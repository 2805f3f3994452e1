"""ThroughputHook in a real Runner on CUDA with AMP: the peaks are the
interval's (a planted allocation shows in its interval only; validation's
memory in none), no sync between publications, MFU against the table's
peak for the number formats that ran."""
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import Runner

from mmstats.hooks import ThroughputHook
from mmstats.throughput import peak_flops
from tests.helpers.runner import read_scalars, toy_cfg
from .common import requires_cuda, sync_debug_error

pytestmark = requires_cuda

MIB = 1024 * 1024
PLANT_MIB = 256  # a temporary tensor at iteration 5 (interval 4-6)
VAL_MIB = 1024  # held by validation: never a training peak


@HOOKS.register_module(force=True)
class CudaPeakHook(Hook):
    """Reads the allocator's peak just before ThroughputHook, allocates a
    temporary tensor at iteration 5 and a large one during validation."""
    priority = 'ABOVE_NORMAL'

    def __init__(self) -> None:
        self.peaks = {}
        self.held = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter + 1 == 5:
            torch.empty(  # freed at once: only the peak keeps it
                PLANT_MIB * MIB,
                dtype=torch.uint8,
                device='cuda').zero_()

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.peaks[runner.iter + 1] = torch.cuda.max_memory_allocated() / MIB

    def before_val_iter(self, runner, batch_idx, data_batch=None):
        if self.held is None:
            self.held = torch.empty(
                VAL_MIB * MIB, dtype=torch.uint8, device='cuda')

    def after_val_epoch(self, runner, metrics=None):
        self.held = None


def test_cuda_peaks_no_sync_and_mfu(tmp_path, clean_mmengine):
    torch.cuda.reset_peak_memory_stats()
    cfg = toy_cfg(
        tmp_path, by_epoch=False, max_iters=9, val_interval=7, log_interval=3)
    cfg.optim_wrapper = dict(
        type='AmpOptimWrapper',
        dtype='bfloat16',
        optimizer=dict(type='SGD', lr=0.1, momentum=0.9))
    cfg.custom_hooks = [
        dict(type='mmstats.ThroughputHook'),
        dict(type='CudaPeakHook')
    ]
    runner = Runner.from_cfg(cfg)
    hook = [h for h in runner.hooks if isinstance(h, ThroughputHook)][0]
    checked = []

    def no_sync(method):

        def wrapped(runner, batch_idx, *args, **kwargs):
            step = runner.iter + 1
            if step in (2, 3, 6, 9):  # counted, or a publication
                return method(runner, batch_idx, *args, **kwargs)
            with sync_debug_error():
                method(runner, batch_idx, *args, **kwargs)
            checked.append(step)

        return wrapped

    hook.before_train_iter = no_sync(hook.before_train_iter)
    hook.after_train_iter = no_sync(hook.after_train_iter)
    runner.train()
    assert len(checked) == 2 * 5
    peaks = [h for h in runner.hooks if isinstance(h, CudaPeakHook)][0].peaks
    scalars = read_scalars(runner)
    for step in (3, 6, 9):
        record = scalars[step]
        assert record['memory/max_allocated'] == peaks[step]
        assert record['memory/max_allocated_rank'] == 0
        assert record['memory/max_reserved'] >= peaks[step]
        assert 'memory/max_rss' not in record
    assert scalars[6]['memory/max_allocated'] >= PLANT_MIB
    assert scalars[3]['memory/max_allocated'] < PLANT_MIB
    # validation after iteration 7 held VAL_MIB: not in 7-9
    assert scalars[9]['memory/max_allocated'] < PLANT_MIB
    assert scalars[3]['memory/max'] == scalars[3]['memory/max_allocated']
    kinds = hook._flops.by_kind
    assert kinds.get('bf16', 0) > 0
    name = torch.cuda.get_device_name()
    if all(peak_flops(name, kind) for kind, n in kinds.items() if n):
        peak = hook._flops.peak(name)
        for step in (3, 6, 9):
            record = scalars[step]
            assert record['throughput/mfu'] == pytest.approx(
                record['throughput/flops_per_s'] / peak, rel=1e-12)
            assert 0 < record['throughput/mfu'] < 1
    else:
        assert 'throughput/mfu' not in scalars[3]
