# Copyright (c) mmstats contributors. All rights reserved.
"""The torch APIs mmstats calls whose name or signature changed between
torch 2.1 and the newest, in one place (``docs/compat.md``).

Each function here gives the newest API where the installed torch has it
and the older one otherwise, with the same result; a feature with no older
API (FSDP2, ``report()`` inside compiled graphs, the checkpoint state-dict
API) asks :func:`require_torch`, which refuses with the version it needs.

- ``torch.distributed.tensor.DTensor``: 2.5; ``torch.distributed._tensor``
  before.
- ``fully_shard``, ``FSDPModule``, ``MixedPrecisionPolicy`` in
  ``torch.distributed.fsdp``: 2.6; ``torch.distributed._composable.fsdp``
  in 2.4 and 2.5 (on GPUs only: it needs CUDA streams); refused before.
- ``torch.compiler.is_compiling``: 2.3; ``torch._dynamo.is_compiling``
  before (once dynamo is imported).
- ``torch.library.register_fake``: 2.4; ``impl_abstract`` in 2.2 and 2.3,
  a ``Meta`` kernel before.
- ``torch._foreach_norm(..., dtype=)``: 2.4; the norms of copies in that
  dtype before.
- ``FlopCounterMode.flop_registry``: 2.2; ``flop_mapping`` (formulas of
  shapes) before.
- CPU float16 ``aminmax``: 2.2; in float32 (exact) before.
- Optimizer step hooks: torch 2.1 runs none after ``import deepspeed``;
  the instance's ``step`` is wrapped instead.
- mmstats' custom ops inside ``torch.compile``: :data:`COMPILED_OPS`.
- The default process group's store: no public accessor in torch 2.1 to
  2.14; ``distributed_c10d._get_default_store`` in all of them
  (:func:`default_store`).
- FSDP1's ``SHARDED_STATE_DICT`` tensors: ``ShardedTensor``, only in the
  private ``torch.distributed._shard`` in every version
  (:func:`sharded_tensor_class`).
"""
import re
import sys
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

__all__ = [
    'TORCH_VERSION', 'COMPILED_OPS', 'torch_at_least', 'require_torch',
    'require_cpu_fully_shard', 'dtensor_class', 'sharded_tensor_class',
    'fsdp_module_class', 'fully_shard_api', 'register_step_hooks',
    'is_compiling', 'register_fake', 'foreach_norm', 'flop_registry',
    'aminmax', 'default_store', 'store_has_key', 'dcp_to_torch_save'
]


def _release(version: str) -> Tuple[int, ...]:
    match = re.match(r'\d+(\.\d+)*', version)
    return tuple(int(p) for p in match.group(0).split('.')) if match else ()


#: the installed torch's release, e.g. ``(2, 13, 0)``
TORCH_VERSION = _release(torch.__version__)

#: the oldest torch whose inductor keeps mmstats' side-effect-only custom
#: ops (``mmstats::report_row``, ``mmstats::module_act``) in a compiled
#: graph: torch 2.8 drops them (the reports inside ``torch.compile`` never
#: arrive, measured); 2.11, 2.13 and 2.14 keep them; 2.9 and 2.10 were not
#: measured
COMPILED_OPS = '2.11'


def torch_at_least(version: str) -> bool:
    """Whether the installed torch is ``version`` or newer.

    Example:
        >>> torch_at_least('2.1')
        True
    """
    need = _release(version)
    return TORCH_VERSION[:len(need)] >= need


def require_torch(version: str, feature: str) -> None:
    """Raise RuntimeError naming ``feature`` and the torch it needs, where
    the installed torch is older than ``version``.

    Example:
        >>> require_torch('2.1', 'anything')  # passes
    """
    if not torch_at_least(version):
        raise RuntimeError(
            f'{feature} needs torch >= {version} (found {torch.__version__}'
            f'); it has no older API to fall back on. Upgrade torch, or '
            f'leave {feature} out of the config (docs/compat.md).')


def default_store() -> Optional[Any]:
    """The store of the default process group (the one
    ``init_process_group`` made: torchrun's ``TCPStore`` or the
    ``MASTER_ADDR:MASTER_PORT`` one), or None without a process group.

    torch has no public accessor for it up to 2.14 (the hang watch needs
    the store the ranks already share, not a new server on a port of its
    own): the private ``_get_default_store`` has it in every version from
    2.1 on; where it is missing this returns None and the hang watch says
    so (``docs/hangs.md``).

    Example:
        >>> default_store() is None  # no process group in a doctest
        True
    """
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    getter = getattr(dist.distributed_c10d, '_get_default_store', None)
    return getter() if getter is not None else None


def store_has_key(store: Any, key: str) -> bool:
    """Whether ``key`` is set in a ``torch.distributed`` store, without
    waiting for it: ``Store.check`` (torch >= 2.2); before, a wait of one
    millisecond (torch 2.1's stores have no ``check``).

    Example:
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()
        >>> store.set('a', '1')
        >>> store_has_key(store, 'a'), store_has_key(store, 'b')
        (True, False)
    """
    check = getattr(store, 'check', None)
    if check is not None:
        return check([key])
    from datetime import timedelta
    try:
        store.wait([key], timedelta(milliseconds=1))
    except RuntimeError:  # the wait's timeout: not set
        return False
    return True


def require_cpu_fully_shard(feature: str) -> None:
    """Raise RuntimeError naming ``feature`` and the torch it needs where
    FSDP2 would run on the CPU (no CUDA) with torch < 2.6, whose
    ``fully_shard`` uses CUDA streams even for CPU tensors (torch 2.4.1
    trains until the first forward, then fails in "CUDA driver version is
    insufficient").

    Example:
        >>> if torch_at_least('2.6') or torch.cuda.is_available():
        ...     require_cpu_fully_shard('FSDP2')  # nothing to refuse
    """
    if not torch.cuda.is_available() and not torch_at_least('2.6'):
        raise RuntimeError(
            f'{feature} on the CPU needs torch >= 2.6 (found '
            f'{torch.__version__}): the fully_shard of older torch uses CUDA '
            'streams, and this machine has no CUDA. Upgrade torch, or use '
            "mmstats.FSDPStrategy (FSDP1) or DDPStrategy here "
            '(docs/compat.md).')


def dtensor_class() -> type:
    """``DTensor``: public in torch 2.5, ``torch.distributed._tensor``
    before.

    Example:
        >>> dtensor_class().__name__
        'DTensor'
    """
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        from torch.distributed._tensor import DTensor
    return DTensor


def sharded_tensor_class() -> Optional[type]:
    """FSDP1's ``ShardedTensor`` (what its ``SHARDED_STATE_DICT`` holds),
    or None where torch has none. torch exports it from no public module
    (2.1 to 2.14: ``torch.distributed._shard.sharded_tensor`` only), so
    the private import lives here, beside the other shims.

    Example:
        >>> getattr(sharded_tensor_class(), '__name__', None) in (
        ...     'ShardedTensor', None)
        True
    """
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
    except ImportError:  # pragma: no cover - a torch without it
        return None
    return ShardedTensor


def fsdp_module_class() -> Optional[type]:
    """FSDP2's ``FSDPModule`` (2.6; ``torch.distributed._composable.fsdp``
    in 2.4 and 2.5), or None where torch has no FSDP2.

    Example:
        >>> getattr(fsdp_module_class(), '__name__', None) in ('FSDPModule',
        ...                                                     None)
        True
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule
        except ImportError:
            return None
    return FSDPModule


def fully_shard_api() -> Tuple[Callable, type]:
    """FSDP2's ``(fully_shard, MixedPrecisionPolicy)``: public in torch
    2.6, ``torch.distributed._composable.fsdp`` in 2.4 and 2.5; refused
    before (RuntimeError naming the torch it needs).

    Example:
        >>> fully_shard, policy = fully_shard_api()
        >>> fully_shard.__name__, policy.__name__
        ('fully_shard', 'MixedPrecisionPolicy')
    """
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        require_torch('2.4', 'FSDP2 (mmstats.FullyShard)')
        from torch.distributed._composable.fsdp import (MixedPrecisionPolicy,
                                                        fully_shard)
    return fully_shard, MixedPrecisionPolicy


def register_step_hooks(optimizer: torch.optim.Optimizer, pre: Callable,
                        post: Callable) -> List[Any]:
    """``optimizer.register_step_pre_hook(pre)`` and
    ``register_step_post_hook(post)``; their handles.

    Where the optimizer's class ``step`` runs no hooks, the instance's
    ``step`` is wrapped instead (the same calls, the same skipping under
    GradScaler, which calls ``optimizer.step`` only for a finite step): torch
    2.1 patches a class's ``step`` with its hook runner once, marked
    ``hooked``, and after ``import deepspeed`` (0.18) the class's ``step`` is
    an unpatched function that carries the mark, so registered hooks never
    run, silently.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> calls = []
        >>> handles = register_step_hooks(sgd, lambda *a: calls.append('pre'),
        ...                               lambda *a: calls.append('post'))
        >>> model(torch.ones(2)).sum().backward()
        >>> sgd.step()
        >>> calls
        ['pre', 'post']
        >>> for handle in handles:
        ...     handle.remove()
    """
    probe = torch.optim.Optimizer.profile_hook_step(lambda *a, **k: None)
    class_step = getattr(type(optimizer), 'step', None)
    if getattr(class_step, '__code__', None) is probe.__code__:
        return [
            optimizer.register_step_pre_hook(pre),
            optimizer.register_step_post_hook(post)
        ]
    return [_StepWrapper(optimizer, pre, post)]


class _StepWrapper:
    """``optimizer.step`` wrapped with ``pre`` and ``post`` until
    :meth:`remove` (what was there before comes back)."""

    def __init__(self, optimizer: torch.optim.Optimizer, pre: Callable,
                 post: Callable) -> None:
        import functools
        self.optimizer = optimizer
        self.own = vars(optimizer).get('step')  # e.g. a scheduler's wrap
        step = optimizer.step

        @functools.wraps(step)  # keeps the marks schedulers look for
        def hooked(*args, **kwargs):
            pre(optimizer, args, kwargs)
            out = step(*args, **kwargs)
            post(optimizer, args, kwargs)
            return out

        optimizer.step = hooked

    def remove(self) -> None:
        if self.own is not None:
            self.optimizer.step = self.own
        else:
            vars(self.optimizer).pop('step', None)


def _is_compiling_before_2_3() -> bool:
    """torch < 2.3: ``torch._dynamo.is_compiling()``, without importing
    dynamo (nothing traces before it is imported)."""
    dynamo = sys.modules.get('torch._dynamo')
    return dynamo is not None and dynamo.is_compiling()


#: whether dynamo is tracing the caller: ``torch.compiler.is_compiling``
#: (2.3; bound directly, the hot path of ``report()``), before it
#: ``torch._dynamo.is_compiling`` once dynamo is imported
is_compiling: Callable[[], bool] = getattr(torch.compiler, 'is_compiling',
                                           None) or _is_compiling_before_2_3


def register_fake(qualname: str, fn: Callable,
                  lib: 'torch.library.Library') -> None:
    """Register ``fn`` as the fake (meta) implementation of the op
    ``qualname`` defined in ``lib``: ``torch.library.register_fake`` (2.4),
    ``impl_abstract`` (2.2, 2.3), a ``Meta`` kernel before.

    Example:
        >>> lib = torch.library.Library('mmstats_doc', 'FRAGMENT')
        >>> _ = lib.define('noop(Tensor x) -> ()')
        >>> register_fake('mmstats_doc::noop', lambda x: None, lib)
    """
    new = getattr(torch.library, 'register_fake', None)
    if new is not None:
        new(qualname, fn, lib=lib)
        return
    old = getattr(torch.library, 'impl_abstract', None)
    if old is not None:
        old(qualname, fn, lib=lib)
        return
    lib.impl(qualname.split('::')[1], fn, 'Meta')


def foreach_norm(tensors: Sequence[torch.Tensor],
                 ord: float,
                 dtype: Optional[torch.dtype] = None) -> List[torch.Tensor]:
    """The ``ord``-norm of each tensor, accumulated and returned in
    ``dtype`` (None: each tensor's own): one ``torch._foreach_norm`` (its
    ``dtype`` argument is torch 2.4's), or the norms of ``dtype`` copies
    before (the same numbers, one more kernel per tensor).

    Example:
        >>> [n.item() for n in foreach_norm([torch.ones(4)], 2, torch.float64)]
        [2.0]
    """
    if dtype is None:
        return torch._foreach_norm(list(tensors), ord)
    if _FOREACH_NORM_DTYPE:
        return torch._foreach_norm(list(tensors), ord, dtype=dtype)
    return torch._foreach_norm([t.to(dtype) for t in tensors], ord)


_FOREACH_NORM_DTYPE = torch_at_least('2.4')


def flop_registry(counter: object) -> dict:
    """The op -> formula table of a ``FlopCounterMode``, each formula
    called as ``formula(*args, **kwargs, out_val=out)`` with the op's
    tensors (``flop_registry`` from torch 2.2; before, ``flop_mapping``,
    whose formulas take shapes: wrapped here).

    Example:
        >>> from torch.utils.flop_counter import FlopCounterMode
        >>> registry = flop_registry(FlopCounterMode(display=False))
        >>> a, b = torch.ones(2, 3), torch.ones(3, 4)
        >>> registry[torch.ops.aten.mm](a, b, out_val=a @ b)  # 2 * 2 * 3 * 4
        48
    """
    registry = getattr(counter, 'flop_registry', None)
    if registry is not None:
        return registry
    return {op: _of_shapes(f) for op, f in counter.flop_mapping.items()}


def _of_shapes(formula: Callable) -> Callable:
    """torch 2.1's ``formula(*shapes, out_shape=)`` called with tensors."""
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import get_shape

    def count(*args, out_val=None, **kwargs) -> int:
        args, kwargs, out_shape = tree_map(get_shape, (args, kwargs, out_val))
        return formula(*args, **kwargs, out_shape=out_shape)

    return count


def aminmax(values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``torch.aminmax``; CPU float16 in float32 where torch has no kernel
    for it (2.1; the conversion is exact).

    Example:
        >>> [t.item() for t in aminmax(torch.tensor([3., -1., 2.]))]
        [-1.0, 3.0]
    """
    if (_HALF_AMINMAX_MISSING and values.dtype == torch.float16
            and values.device.type == 'cpu'):
        low, high = torch.aminmax(values.float())
        return low.half(), high.half()
    return torch.aminmax(values)


_HALF_AMINMAX_MISSING = not torch_at_least('2.2')


def dcp_to_torch_save(dcp_dir: str, path: str) -> None:
    """``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``: the
    DCP checkpoint ``dcp_dir`` as one ``torch.save`` file ``path``, on one
    process without a process group. A torch without it (older than the
    sharded strategies need) is refused naming the API.

    Example:
        .. code-block:: python

            dcp_to_torch_save('work_dirs/fsdp/epoch_2.pth', 'whole.pth')
    """
    try:
        from torch.distributed.checkpoint.format_utils import \
            dcp_to_torch_save as convert
    except ImportError as exc:  # pragma: no cover - torch < 2.2
        raise RuntimeError(
            'reading a sharded checkpoint on one process needs '
            'torch.distributed.checkpoint.format_utils.dcp_to_torch_save '
            f'(torch >= 2.2); this is torch {torch.__version__}') from exc
    convert(dcp_dir, path)
