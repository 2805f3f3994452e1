# Copyright (c) mmstats contributors. All rights reserved.
"""FLOPs of one real training iteration, counted once
(:class:`IterationFlops`, over torch.utils.flop_counter.FlopCounterMode),
and the peak FLOP/s of common accelerators (:data:`PEAK_FLOPS`,
:func:`peak_flops`) that MFU is measured against.

What is counted is what torch's counter counts: matrix multiplications,
convolutions and attention, forward and backward as they ran (a recomputed
forward under activation checkpointing too); elementwise ops, norms,
pooling and the optimizer step count nothing, as in the usual MFU
definition (PaLM, Megatron). Under FSDP the compute runs on the gathered,
full parameters, so the count is the full model's on this rank's batch,
never a shard's.
"""
import math
import re
from collections import defaultdict
from typing import Dict, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from mmstats.utils.torch_compat import flop_registry

__all__ = ['PEAK_FLOPS', 'peak_flops', 'IterationFlops']

#: Dense peak FLOP/s per device (no sparsity), by the first pattern that
#: ``re.search``-es ``torch.cuda.get_device_name()``; kinds ``bf16``,
#: ``fp16``, ``tf32`` (float32 on tensor cores) and ``fp32``. From the
#: vendors' data sheets (the bf16 figures are torchtitan's too); a kind that
#: is missing has no known peak.
PEAK_FLOPS: Tuple[Tuple[str, Dict[str, float]], ...] = (
    (r'H100.*NVL', dict(bf16=835e12, fp16=835e12)),
    (r'H100.*PCIe', dict(bf16=756e12, fp16=756e12, tf32=378e12, fp32=51.2e12)),
    (r'H200.*NVL', dict(bf16=835.5e12, fp16=835.5e12)),
    (r'H100|H200',
     dict(bf16=989.4e12, fp16=989.4e12, tf32=494.7e12, fp32=66.9e12)),
    (r'B200', dict(bf16=2.25e15, fp16=2.25e15)),
    (r'A100', dict(bf16=312e12, fp16=312e12, tf32=156e12, fp32=19.5e12)),
    (r'\bA10\b', dict(bf16=125e12, fp16=125e12, tf32=62.5e12, fp32=31.2e12)),
    (r'L40S',
     dict(bf16=362.05e12, fp16=362.05e12, tf32=183.2e12, fp32=91.6e12)),
    (r'\bL4\b', dict(bf16=121e12, fp16=121e12, tf32=60e12, fp32=30.3e12)),
    (r'V100.*SXM', dict(fp16=125e12, fp32=15.7e12)),
    (r'V100.*PCIE', dict(fp16=112e12, fp32=14e12)),
    (r'\bT4\b', dict(fp16=65e12, fp32=8.1e12)),
    (r'MI300X|MI325X', dict(bf16=1307.4e12, fp16=1307.4e12)),
)

_KINDS = {torch.bfloat16: 'bf16', torch.float16: 'fp16'}


def peak_flops(device_name: str, kind: str) -> Optional[float]:
    """The dense peak FLOP/s of ``device_name`` for ``kind`` (``'bf16'``,
    ``'fp16'``, ``'tf32'``, ``'fp32'``) from :data:`PEAK_FLOPS`, or None
    where it is not known.

    Example:
        >>> peak_flops('NVIDIA H100 80GB HBM3', 'bf16')
        989400000000000.0
        >>> peak_flops('NVIDIA A100-SXM4-80GB', 'tf32')
        156000000000000.0
        >>> peak_flops('cpu', 'fp32') is None
        True
    """
    for pattern, peaks in PEAK_FLOPS:
        if re.search(pattern, device_name):
            return peaks.get(kind)
    return None


def _tf32_allowed(conv: bool) -> bool:
    """Whether float32 ops of this kind may run on tensor cores (TF32)."""
    if conv:
        return torch.backends.cudnn.allow_tf32
    return (torch.backends.cuda.matmul.allow_tf32
            or torch.get_float32_matmul_precision() != 'highest')


class _KindsMode(TorchDispatchMode):
    """FLOPs by the number format their op ran in, from the formulas of
    the FlopCounterMode ``counter`` (the ops it counts directly)."""

    def __init__(self, counter: FlopCounterMode) -> None:
        super().__init__()
        self.registry = flop_registry(counter)
        self.flops: Dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self.registry.get(func._overloadpacket)
        if formula is not None:
            first = next(
                (a for a in args
                 if isinstance(a, torch.Tensor) and a.is_floating_point()),
                None)
            dtype = None if first is None else first.dtype
            kind = _KINDS.get(dtype, 'other')
            if dtype == torch.float32 and first.is_cuda:
                conv = 'conv' in func._overloadpacket.__name__
                kind = 'tf32' if _tf32_allowed(conv) else 'fp32'
            elif dtype == torch.float32:
                kind = 'fp32'
            self.flops[kind] += formula(*args, **kwargs, out_val=out)
        return out


class IterationFlops:
    """Count the FLOPs of what runs between :meth:`start` and :meth:`stop`
    (one training iteration), with the number formats they ran in.

    Attributes:
        total (int, optional): The FLOPs counted (None before :meth:`stop`).
        by_kind (dict[str, int]): FLOPs by number format (``'bf16'``,
            ``'fp16'``, ``'tf32'``, ``'fp32'``, ``'other'``).

    Example:
        >>> import torch
        >>> counter = IterationFlops()
        >>> counter.start()
        >>> _ = torch.ones(4, 3) @ torch.ones(3, 2)
        >>> counter.stop()
        >>> counter.total, dict(counter.by_kind)  # 2 * 4 * 3 * 2
        (48, {'fp32': 48})
        >>> counter.peak('cpu') is None  # no known peak
        True
    """

    def __init__(self) -> None:
        self.total: Optional[int] = None
        self.by_kind: Dict[str, int] = {}
        self._modes: Optional[tuple] = None

    def start(self) -> None:
        """Start counting (nothing is counted twice: a second start while
        counting is ignored)."""
        if self._modes is not None:
            return
        counter = FlopCounterMode(display=False)
        kinds = _KindsMode(counter)
        counter.__enter__()
        kinds.__enter__()
        self._modes = (counter, kinds)

    @property
    def counting(self) -> bool:
        """Whether :meth:`start` was called and :meth:`stop` not yet."""
        return self._modes is not None

    def stop(self) -> None:
        """Stop counting; :attr:`total` and :attr:`by_kind` hold the
        count."""
        if self._modes is None:
            return
        counter, kinds = self._modes
        self._modes = None
        try:
            kinds.__exit__(None, None, None)
        finally:
            counter.__exit__(None, None, None)
        self.total = int(counter.get_total_flops())
        self.by_kind = dict(kinds.flops)

    def peak(self, device_name: str) -> Optional[float]:
        """The peak FLOP/s of ``device_name`` for the counted mix of number
        formats: the FLOP-weighted harmonic mean of each format's peak
        (the time the counted FLOPs would take at peak, divided into them);
        None where a format that ran has no known peak.

        Example:
            >>> counter = IterationFlops()
            >>> counter.by_kind = dict(bf16=3, fp32=1)
            >>> name = 'NVIDIA A100-SXM4-80GB'
            >>> round(counter.peak(name) / 1e12, 3)  # 4 / (3/312 + 1/19.5)
            65.684
        """
        seconds = 0.0
        for kind, flops in self.by_kind.items():
            if not flops:
                continue
            peak = peak_flops(device_name, kind)
            if peak is None:
                return None
            seconds += flops / peak
        total = sum(self.by_kind.values())
        if not total or not seconds or not math.isfinite(seconds):
            return None
        return total / seconds
