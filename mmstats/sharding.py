# Copyright (c) mmstats contributors. All rights reserved.
"""Where a model's parameters live: the part of every parameter this rank
holds under DDP, FSDP1, FSDP2 and DeepSpeed ZeRO, and which of its ranks
counts it.

A statistic of a full tensor that is a sum over its elements (a squared
norm) is the SUM over ranks of the sums over the local parts, provided
every element is counted on exactly one rank: a sharded part on the rank
that holds it, a replicated tensor (DDP, FSDP's ``NO_SHARD``, a DTensor's
``Replicate`` dimension) on the first of its replicas. An empty local
shard counts zero. Nothing is gathered: the local parts are views.

Which layouts are read, and how (``docs/sharding.md``):

- a plain module or DDP: every parameter whole on every rank (no
  reduction needed; :attr:`ParamLayout.sharded` is False);
- FSDP1 (``FullyShardedDataParallel``, ``use_orig_params`` True or False):
  each flat parameter's local shard (``_local_shard``) and sharded gradient,
  cut into the original parameters with FSDP's own shard bookkeeping;
- FSDP2 (``fully_shard``): DTensor parameters and gradients, their
  ``to_local()`` parts;
- DeepSpeed ZeRO-1/2: parameters whole on every rank, each counted where
  this rank's optimizer partition covers it (``_hp_mapping``), which is
  also where its reduced gradient lives between backward and step;
- DeepSpeed ZeRO-3: each parameter's partition ``ds_tensor`` (and
  ``safe_get_local_grad``), without the padding.
"""
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from mmstats.dist import get_rank, get_world_size
from mmstats.utils.torch_compat import (dtensor_class, foreach_norm,
                                        fsdp_module_class, require_torch)

__all__ = [
    'ParamPart', 'ParamLayout', 'sum_squares', 'segment_sum', 'is_sharded',
    'unwrap_model', 'forward_modules', 'reshard'
]


def _flat(tensor: Tensor) -> Tensor:
    return tensor.detach().reshape(-1)


class ParamPart:
    """The part of one original parameter that this rank holds.

    Args:
        module (nn.Module): The module that registers the parameter.
        trainable (bool): Whether the parameter requires a gradient.
        optim_key (Tensor): The tensor an optimizer holds for it (the
            parameter itself, or FSDP1's flat parameter).
        weight (Callable[[], Tensor]): Returns the local part of the values
            (a view, possibly empty).
        grad (Callable[[], Optional[Tensor]]): Returns the local part of the
            gradient, or None when there is none.
        state (Callable[[Tensor], Tensor], optional): Maps a tensor the
            optimizer keeps for ``optim_key`` (``exp_avg``, a momentum
            buffer: shaped like its local part) to this part's elements
            counted on this rank, flattened (empty where none are); None:
            the optimizer's state of this layout cannot be read
            (DeepSpeed keeps it in its own partitions). Defaults to
            flattening it.

    Example:
        >>> from torch import nn
        >>> net = nn.Linear(2, 1)
        >>> part = ParamPart(net, True, net.weight, lambda: net.weight,
        ...                  lambda: net.weight.grad)
        >>> part.weight().shape, part.grad()
        (torch.Size([1, 2]), None)
        >>> part.state(torch.ones(1, 2)).shape
        torch.Size([2])
    """

    __slots__ = ('module', 'trainable', 'optim_key', 'weight', 'grad', 'state')

    def __init__(self,
                 module: nn.Module,
                 trainable: bool,
                 optim_key: Tensor,
                 weight: Callable[[], Tensor],
                 grad: Callable[[], Optional[Tensor]],
                 state: Optional[Callable[[Tensor], Tensor]] = _flat) -> None:
        self.module = module
        self.trainable = trainable
        self.optim_key = optim_key
        self.weight = weight
        self.grad = grad
        self.state = state


def _plain_part(module: nn.Module, param: Tensor, counted: bool) -> ParamPart:
    if not counted:  # a replica of rank 0's: counts zero here
        return _uncounted(module, param, param, lambda p=param: p.grad)
    return ParamPart(
        module,
        param.requires_grad,
        param,
        param.detach,
        lambda p=param: p.grad)


def _uncounted(module: nn.Module, param: Tensor, optim_key: Tensor,
               whole_grad: Callable[[], Optional[Tensor]]) -> ParamPart:
    """A part that counts zero on this rank; its gradient is None exactly
    when the whole parameter has none (the same on every rank)."""
    empty = torch.zeros(0, dtype=param.dtype, device=param.device)

    def grad() -> Optional[Tensor]:
        return None if whole_grad() is None else empty

    return ParamPart(module, optim_key.requires_grad, optim_key, lambda: empty,
                     grad, lambda tensor: empty)


def _dtensor_part(module: nn.Module, param: Tensor) -> ParamPart:
    """An FSDP2 (DTensor) parameter: its local part, or an empty one where
    this rank holds a replica of another rank's part."""
    mesh = param.device_mesh
    _check_spans_world(mesh.size(), 'an FSDP2 device mesh')
    for dim, placement in enumerate(param.placements):
        if placement.is_partial():
            raise ValueError('mmstats: a parameter with a Partial DTensor '
                             'placement has no value of its own')
        if placement.is_replicate() and mesh.get_local_rank(dim) != 0:
            return _uncounted(
                module, param.to_local(), param, lambda p=param: p.grad)

    def grad(p=param):
        return None if p.grad is None else p.grad.to_local()

    def state(tensor: Tensor) -> Tensor:  # a DTensor placed like param
        return _flat(
            tensor.to_local() if hasattr(tensor, 'to_local') else tensor)

    return ParamPart(
        module,
        param.requires_grad,
        param,
        lambda p=param: p.detach().to_local(),
        grad,
        state)


def _check_spans_world(size: int, what: str) -> None:
    """The parts are summed over the default group: a shard group smaller
    than the world (pipeline stages with meshes of their own) would add
    other stages' parameters."""
    if size != get_world_size():
        raise ValueError(
            f'mmstats: {what} spans {size} of {get_world_size()} ranks; '
            'sharding over a subset of the ranks (e.g. pipeline stages) is '
            'not supported')


def _slice(source: Callable[[], Optional[Tensor]], start: int,
           stop: int) -> Callable[[], Optional[Tensor]]:

    def part() -> Optional[Tensor]:
        tensor = source()
        return None if tensor is None else tensor.detach()[start:stop]

    return part


def _fsdp1_parts(unit: nn.Module, rank: int, seen: set) -> List[ParamPart]:
    """The original parameters of one FSDP1 unit, cut out of its flat
    parameter's local shard with FSDP's shard bookkeeping."""
    handle = getattr(unit, '_handle', None)
    if handle is None or id(handle.flat_param) in seen:
        return []
    flat = handle.flat_param
    seen.add(id(flat))
    if 'HYBRID' in handle._sharding_strategy.name:
        raise ValueError(
            'mmstats: FSDP sharding_strategy=HYBRID_SHARD is not supported '
            '(parameters replicated across nodes and sharded within them); '
            'use FULL_SHARD, SHARD_GRAD_OP or NO_SHARD')
    _check_spans_world(unit.process_group.size(), "an FSDP unit's group")
    counted = handle.uses_sharded_strategy or rank == 0
    originals = flat._params or [None] * len(flat._param_infos)
    parts = []
    for index, (info, shard, original) in enumerate(
            zip(flat._param_infos, flat._shard_param_infos, originals)):
        if original is not None:  # use_orig_params=True
            seen.add(id(original))
        whole_grad = _fsdp1_grad(handle, index)
        key = original if original is not None else flat  # the optimizer's
        if not (counted and shard.in_shard):
            parts.append(_uncounted(info.module, flat, key, whole_grad))
            continue
        start = shard.offset_in_shard
        stop = start + shard.numel_in_shard
        parts.append(
            ParamPart(
                info.module,
                key.requires_grad,
                key,
                _slice(
                    lambda h=handle: _local_shard(h.flat_param), start, stop),
                _slice(whole_grad, start, stop),
                # the optimizer's state of an original parameter is shaped
                # like its local view; of the flat parameter, like the shard
                _flat if original is not None else
                (lambda tensor, a=start, b=stop: _flat(tensor)[a:b])))
    return parts


def _local_shard(flat: Tensor) -> Tensor:
    """This rank's shard of a flat parameter (the flat parameter itself
    until FSDP's lazy initialisation names it ``_local_shard``)."""
    return getattr(flat, '_local_shard', flat)


def _fsdp1_grad(handle, index: int) -> Callable[[], Optional[Tensor]]:
    """The unit's sharded flat gradient, or None where original parameter
    ``index`` has no gradient (FSDP's per-parameter mask, the same on every
    rank)."""
    flat = handle.flat_param

    def grad() -> Optional[Tensor]:
        mask = flat._is_grad_none_mask
        if mask is not None and (mask[index]
                                 or not flat._params[index].requires_grad):
            return None
        return handle.sharded_grad

    return grad


def _zero3_part(module: nn.Module, param: Tensor) -> ParamPart:
    """A DeepSpeed ZeRO-3 parameter: its partition ``ds_tensor`` without
    the padding; the gradient partition between backward and step."""

    def size(p=param) -> int:
        part = p.ds_tensor.numel()  # partitions are contiguous, by rank
        start = part * get_rank(p.ds_process_group)
        return max(0, min(part, p.ds_numel - start))

    def weight(p=param) -> Tensor:
        return p.ds_tensor.detach().reshape(-1).narrow(0, 0, size())

    def grad(p=param) -> Optional[Tensor]:
        from deepspeed.utils import safe_get_local_grad
        local = safe_get_local_grad(p)
        return None if local is None else local.reshape(-1).narrow(
            0, 0, size())

    return ParamPart(module, param.requires_grad, param, weight, grad, None)


def _zero12_part(module: nn.Module, param: Tensor) -> ParamPart:
    """A DeepSpeed ZeRO-1/2 parameter: whole on every rank, its gradient
    (between backward and step) and optimizer state partitioned; the
    slice this rank's partition covers (``_hp_mapping``), empty where it
    covers none."""
    empty = param.detach().new_zeros(0)

    def weight(p=param) -> Tensor:
        mapping = p._hp_mapping
        if mapping is None:
            return empty
        address = mapping.lp_fragment_address
        return p.detach().reshape(-1).narrow(0, address.start, address.numel)

    def grad(p=param) -> Tensor:
        mapping = p._hp_mapping
        if mapping is None:
            return empty
        return mapping.get_lp_grad_fragment(
            p._index_in_param_group).reshape(-1)

    return ParamPart(module, param.requires_grad, param, weight, grad, None)


class ParamLayout:
    """The local parts of every parameter of ``model``, each element
    counted on exactly one rank.

    Every rank has the same parts in the same order (the structure of the
    model, not its shards), so a payload built from them has the same shape
    on every rank.

    Args:
        model (nn.Module): The model as trained: a plain module, DDP, an
            FSDP1 module, a module with FSDP2 ``fully_shard`` units, or a
            DeepSpeed ZeRO-3 engine's module.

    Attributes:
        parts (list[ParamPart]): One per original parameter.
        sharded (bool): Whether the per-rank sums over :attr:`parts` must
            be SUM-reduced over the world to be those of the full tensors
            (otherwise every rank already holds every parameter whole).
        kind (str): ``'plain'``, ``'fsdp'``, ``'fsdp2'``, ``'zero12'``
            (DeepSpeed ZeRO-1/2) or ``'zero3'``.

    Example:
        >>> from torch import nn
        >>> layout = ParamLayout(nn.Linear(3, 2))
        >>> layout.kind, layout.sharded, len(layout.parts)
        ('plain', False, 2)
        >>> layout.parts[0].weight().shape
        torch.Size([2, 3])
    """

    def __init__(self, model: nn.Module) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel
        DTensor = dtensor_class()
        if not isinstance(model, nn.Module):  # mmengine's DeepSpeed wrapper
            model = model.module
        rank = get_rank()
        seen: set = set()
        parts: List[ParamPart] = []
        kinds = set()
        for unit in model.modules():
            if isinstance(unit, FullyShardedDataParallel):
                _require_fsdp1()
                kinds.add('fsdp')
                parts += _fsdp1_parts(unit, rank, seen)
        plain = []
        for module in model.modules():
            for param in module._parameters.values():
                if param is None or id(param) in seen:
                    continue
                seen.add(id(param))
                if isinstance(param, DTensor):
                    kinds.add('fsdp2')
                    parts.append(_dtensor_part(module, param))
                elif hasattr(param, 'ds_tensor'):
                    kinds.add('zero3')
                    parts.append(_zero3_part(module, param))
                elif hasattr(param, '_hp_mapping'):
                    kinds.add('zero12')
                    parts.append(_zero12_part(module, param))
                else:
                    plain.append((module, param))
        if len(kinds) > 1:
            raise ValueError(f'mmstats: a model mixing {sorted(kinds)} '
                             'sharding is not supported')
        self.kind = kinds.pop() if kinds else 'plain'
        self.sharded = self.kind != 'plain'
        # parameters outside every shard are replicated: counted on rank 0
        self.parts = parts + [
            _plain_part(m, p, rank == 0 or not self.sharded) for m, p in plain
        ]

    def owners(self, targets: Sequence[nn.Module]) -> Dict[int, List[int]]:
        """For each part (by position), the positions in ``targets`` of the
        modules that contain it (recursively); parts in none are left
        out."""
        inside: Dict[int, List[int]] = {}
        for index, target in enumerate(targets):
            for module in target.modules():
                inside.setdefault(id(module), []).append(index)
        return {
            i: inside[id(part.module)]
            for i, part in enumerate(self.parts) if id(part.module) in inside
        }


def sum_squares(tensors: Sequence[Tensor],
                segments: Sequence[Union[int, Sequence[int]]],
                num_segments: int, device: torch.device) -> Tensor:
    """Per segment, the float64 sum of the squares of the elements of its
    tensors; 0 for an empty segment; no host sync. ``segments[i]`` is the
    segment of ``tensors[i]``, or the segments (a tensor inside nested
    modules counts in each, its norm computed once).

    Example:
        >>> import torch
        >>> out = sum_squares([torch.ones(3), torch.full((2,), 2.)],
        ...                   [1, (0, 1)], 2, torch.device('cpu'))
        >>> [round(x, 9) for x in out.tolist()]  # 0: 4 + 4; 1: 1 + 1 + 1 + 8
        [8.0, 11.0]
    """
    if not tensors:
        return torch.zeros(num_segments, dtype=torch.float64, device=device)
    squares = torch.stack(foreach_norm(tensors, 2, torch.float64)).square()
    return segment_sum(squares, segments, num_segments)


def segment_sum(values: Tensor, segments: Sequence[Union[int, Sequence[int]]],
                num_segments: int) -> Tensor:
    """Per segment, the float64 sum of ``values[i]`` over the ``i`` whose
    ``segments[i]`` is (or contains) it; 0 for an empty segment; one
    ``index_add_``, no host sync.

    Example:
        >>> import torch
        >>> out = segment_sum(torch.tensor([1., 2., 4.]), [0, (0, 1), 1], 3)
        >>> out.tolist()
        [3.0, 6.0, 0.0]
    """
    out = torch.zeros(num_segments, dtype=torch.float64, device=values.device)
    if not len(segments):
        return out
    values = values.to(torch.float64)
    if all(isinstance(s, int) for s in segments):
        index = list(segments)
    else:
        rows = [
            i for i, s in enumerate(segments)
            for _ in ((s, ) if isinstance(s, int) else s)
        ]
        values = values[torch.tensor(rows, device=values.device)]
        index = [
            t for s in segments for t in ((s, ) if isinstance(s, int) else s)
        ]
    return out.index_add_(0, torch.tensor(index, device=values.device), values)


def is_sharded(model: nn.Module) -> bool:
    """Whether the parameters of ``model`` are sharded over the ranks
    (FSDP1, FSDP2 or DeepSpeed ZeRO-3): then every forward is a collective
    (ZeRO-1/2 keep every parameter whole: their forwards are not).

    Example:
        >>> from torch import nn
        >>> is_sharded(nn.Linear(2, 2))
        False
    """
    from torch.distributed.fsdp import FullyShardedDataParallel
    DTensor = dtensor_class()
    if not isinstance(model, nn.Module):  # mmengine's DeepSpeed wrapper
        model = model.module
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        _require_fsdp1()
        return True
    return any(
        isinstance(p, DTensor) or hasattr(p, 'ds_tensor')
        for p in model.parameters())


def _require_fsdp1() -> None:
    """Refuse an FSDP1 model below torch 2.2 (RuntimeError naming it):
    torch 2.1's FSDP fails its lazy initialisation in a forward that is
    not the training's (PreciseBNHook's), and mmstats' FSDP1 checkpoints
    need ``torch.distributed.checkpoint.state_dict`` (2.2)."""
    require_torch('2.2', "mmstats' hooks on an FSDP1 model")


def unwrap_model(model: Any) -> nn.Module:
    """The user's module inside every wrapper of ``model``: mmengine's model
    wrappers (``MMDistributedDataParallel``, ``MMFullyShardedDataParallel``,
    the DeepSpeed engine wrapper, any registered in ``MODEL_WRAPPERS``),
    ``DistributedDataParallel``, ``DataParallel`` and FSDP1 are stripped.

    Example:
        >>> from torch import nn
        >>> net = nn.Linear(2, 2)
        >>> unwrap_model(nn.DataParallel(net)) is net
        True
    """
    from mmengine.model import is_model_wrapper
    from torch.distributed.fsdp import FullyShardedDataParallel
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel,
                FullyShardedDataParallel)
    while is_model_wrapper(model) or isinstance(model, wrappers):
        model = model.module
    return model


def forward_modules(model: nn.Module) -> Tuple[nn.Module, nn.Module]:
    """The module to run forwards through and the user's module inside it
    (:func:`unwrap_model`).

    Wrappers whose forward only adds collectives for training (DDP,
    ``DataParallel``, mmengine's wrappers of them) are stripped; an FSDP1
    wrapper is kept, since its forward gathers the shards the module
    computes with.

    Example:
        >>> from torch import nn
        >>> net = nn.Linear(2, 2)
        >>> forward_modules(nn.DataParallel(net)) == (net, net)
        True
    """
    from mmengine.model import is_model_wrapper
    from torch.distributed.fsdp import FullyShardedDataParallel
    replicas = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    outer = model
    while not isinstance(outer, FullyShardedDataParallel) and (
            is_model_wrapper(outer) or isinstance(outer, replicas)):
        outer = outer.module
    return outer, unwrap_model(outer)


def reshard(model: Any) -> None:
    """Free the gathered parameters that forwards outside training may
    leave behind, so ``model`` is as sharded as a training step leaves it:
    FSDP2 units are resharded, and a DeepSpeed ZeRO-3 engine (``model`` or
    mmengine's wrapper of it) empties its partition cache (its prefetching
    keeps every parameter gathered until a backward otherwise).

    Example:
        >>> from torch import nn
        >>> reshard(nn.Linear(2, 2))  # not sharded: nothing to free
    """
    FSDPModule = fsdp_module_class()
    engine = model if hasattr(model, 'empty_partition_cache') else getattr(
        model, 'model', None)
    if hasattr(engine, 'empty_partition_cache'):
        engine.empty_partition_cache()
        return
    for module in model.modules() if FSDPModule is not None else ():
        if isinstance(module, FSDPModule):
            module.reshard()
