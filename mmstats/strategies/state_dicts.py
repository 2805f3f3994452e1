# Copyright (c) mmstats contributors. All rights reserved.
"""Checkpoints of a sharded model that hold every rank's shard.

mmengine 0.10.7 saves ``model.state_dict()`` on rank 0. Under FSDP2 that
dict holds ``DTensor``\\ s whose local tensor is rank 0's shard, pickled as
if it were the whole tensor; loading it copies rank 0's rows into every
rank. :class:`ShardedCheckpointing` (the checkpoint methods of
:class:`~mmstats.strategies.FSDPStrategy` and
:class:`~mmstats.strategies.FSDP2Strategy`) goes through torch's
``torch.distributed.checkpoint.state_dict`` API instead, which knows FSDP1
and FSDP2 alike, and writes one of two formats (``docs/checkpoints.md``):

- **full** (one file, like DDP's): every tensor gathered to rank 0, which
  writes an ordinary mmengine checkpoint (``state_dict`` keyed by the
  model's own names, ``optimizer`` keyed by them too). Any runner, one
  process or many, loads it.
- **sharded** (a directory that names itself: ``mmstats_sharded.json``):
  ``torch.distributed.checkpoint`` (DCP) files of every rank's shards
  (``state_dict``, ``optimizer``) and rank 0's ``extra.pth`` (``meta``,
  ``message_hub``, ``param_schedulers``...). DCP reshards on load (another
  world size loads it); :func:`consolidate_checkpoint` turns it into the
  full format without a process group.

Whatever the format, :func:`refuse_partial_tensors` checks what is about to
be written: a ``DTensor`` that is not replicated or a ``ShardedTensor`` in a
single-file checkpoint raises instead of being saved.
"""
from __future__ import annotations
import json
import os
import os.path as osp
import re
import time
from typing import Any, Callable, Iterator, Optional, Tuple

import torch

from mmstats.utils.torch_compat import sharded_tensor_class
from .consolidate import EXTRA, MARKER, is_sharded_checkpoint, read_extra

__all__ = [
    'ShardedCheckpointing', 'refuse_partial_tensors', 'revise_state_dict_keys'
]

#: the parts of an mmengine checkpoint that DCP holds
SHARDED_KEYS = ('state_dict', 'optimizer')
#: what an optimizer state dict holds besides the wrapper's own entries
OPTIMIZER_KEYS = ('state', 'param_groups')


def _leaves(obj: Any, prefix: str = '') -> Iterator[Tuple[str, Any]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _leaves(value, f'{prefix}{key}.')
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _leaves(value, f'{prefix}{i}.')
    else:
        yield prefix[:-1], obj


def _is_partial(value: Any) -> bool:
    """A tensor that holds one rank's part of a larger one."""
    sharded_tensor = sharded_tensor_class()
    if sharded_tensor is not None and isinstance(value, sharded_tensor):
        return True
    placements = getattr(value, 'placements', None)  # a DTensor
    return placements is not None and not all(p.is_replicate()
                                              for p in placements)


def refuse_partial_tensors(checkpoint: dict, where: str) -> None:
    """Raise if ``checkpoint`` holds a sharded tensor (a ``DTensor`` with a
    ``Shard``/``Partial`` placement, a ``ShardedTensor``): written to one
    file, it would claim the whole tensor and hold one rank's part.

    Args:
        checkpoint (dict): What is about to be written.
        where (str): The file, for the message.

    Raises:
        RuntimeError: Naming the first such entry.

    Example:
        >>> refuse_partial_tensors({'state_dict': {'w': torch.ones(2)}},
        ...                        'epoch_1.pth')
    """
    for key, value in _leaves(checkpoint):
        if _is_partial(value):
            raise RuntimeError(
                f'refusing to write {where}: {key} is a '
                f'{type(value).__name__} holding one rank\'s shard '
                f'(local shape {tuple(_local(value).shape)} of '
                f'{tuple(value.shape)}). Save it through '
                "mmstats.FSDP2Strategy / mmstats.FSDPStrategy, which "
                'gather full tensors or write a sharded checkpoint '
                '(docs/checkpoints.md).')


def refuse_together(checkpoint: dict, where: str) -> None:
    """:func:`refuse_partial_tensors` of rank 0's ``checkpoint`` (the one
    a full save writes), raised on every rank at once: no rank waits in a
    collective for a rank that raised (one ``broadcast_object_list``).

    Example:
        >>> refuse_together({'w': torch.ones(2)}, 'epoch_1.pth')
    """
    from mmengine.dist import broadcast_object_list, get_rank
    problem = [None]
    if get_rank() == 0:
        try:
            refuse_partial_tensors(checkpoint, where)
        except RuntimeError as exc:
            problem = [str(exc)]
    broadcast_object_list(problem, src=0)
    if problem[0] is not None:
        raise RuntimeError(problem[0])


def log_incompatible_keys(logger: Any, result: Any) -> None:
    """Warn about a non-strict load's missing and unexpected keys
    (``load_state_dict``'s result), as mmengine's loaders do.

    Example:
        >>> from torch.nn.modules.module import _IncompatibleKeys
        >>> log_incompatible_keys(None, _IncompatibleKeys([], []))
    """
    if result.missing_keys or result.unexpected_keys:
        logger.warning(
            f'missing keys in source state_dict: {result.missing_keys}; '
            f'unexpected keys: {result.unexpected_keys}')


def _local(value: Any) -> torch.Tensor:
    if hasattr(value, 'to_local'):
        return value.to_local()
    shards = value.local_shards()
    return shards[0].tensor if shards else torch.empty(0)


def revise_state_dict_keys(state_dict: dict, revise_keys: list) -> dict:
    """mmengine's ``revise_keys`` (``[(pattern, replacement)]``) applied to
    the keys of a full model state dict. mmengine applies them inside
    ``runner.checkpoint._load_checkpoint_to_model``, which then loads the
    dict into an unsharded module: it cannot be called for a sharded one,
    whose full state dict goes through ``set_model_state_dict``.

    Example:
        >>> revise_state_dict_keys({'module.w': 1}, [(r'^module\\.', '')])
        {'w': 1}
    """
    for pattern, replacement in revise_keys:
        state_dict = {
            re.sub(pattern, replacement, k): v
            for k, v in state_dict.items()
        }
    return state_dict


#: the formats of docs/checkpoints.md: one file of full tensors, or a
#: directory of every rank's shards (torch.distributed.checkpoint)
FORMATS = ('full', 'sharded')
#: mmengine's names of FSDP state dicts, mapped to a format: its 'local'
#: (per-rank pickles of flat shards there) is the sharded format here
MMENGINE_FORMATS = {
    'local': 'sharded',
    'FULL_STATE_DICT': 'full',
    'SHARDED_STATE_DICT': 'sharded',
    'LOCAL_STATE_DICT': 'sharded'
}


def checkpoint_format(owner: str, state_dict_cfg: Any) -> str:
    """The format (``'full'`` or ``'sharded'``) a strategy's
    ``state_dict_cfg`` names: one of :data:`FORMATS`, mmengine's
    ``'local'``, or mmengine's dict form (``state_dict_type``).

    Raises:
        ValueError: Anything else, naming ``owner``'s argument.

    Example:
        >>> checkpoint_format('FSDPStrategy', 'local')
        'sharded'
        >>> checkpoint_format('X', dict(state_dict_type='FULL_STATE_DICT'))
        'full'
    """
    name = state_dict_cfg
    if isinstance(name, dict):
        name = name.get('state_dict_type')
        name = getattr(name, 'name', name)  # torch's StateDictType
    if name in FORMATS:
        return name
    if name in MMENGINE_FORMATS:
        return MMENGINE_FORMATS[name]
    raise ValueError(
        f'{owner}: state_dict_cfg must be one of {FORMATS} (mmengine\'s '
        f"'local' is 'sharded'), got {state_dict_cfg!r}")


class ShardedCheckpointing:
    """The checkpoint methods of an mmengine strategy whose model is
    sharded by FSDP1 or FSDP2, in either format (:data:`FORMATS`).

    Every rank calls them (gathering and DCP are collectives); rank 0
    writes the full format. What it needs is declared and checked when a
    class mixes it in (``__init_subclass__``): the class is an mmengine
    strategy (``SingleDeviceStrategy``'s ``model``, ``optim_wrapper``,
    ``logger``, ``seed``, schedulers and ``resume``), and its instances
    set :attr:`checkpoint_format` (:func:`checkpoint_format`). Its
    methods win wherever it stands among the bases: they are set on the
    class itself, unless the class defines its own.

    Example:
        >>> from mmengine._strategy import DDPStrategy
        >>> class MyStrategy(DDPStrategy, ShardedCheckpointing):
        ...     pass
        >>> MyStrategy.save_checkpoint is ShardedCheckpointing.save_checkpoint
        True
    """

    #: 'full' or 'sharded' (:data:`FORMATS`), set by the strategy
    checkpoint_format: str = 'full'

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        from mmengine._strategy import SingleDeviceStrategy
        if not issubclass(cls, SingleDeviceStrategy):
            raise TypeError(
                f'{cls.__name__}: ShardedCheckpointing is mixed into '
                "mmengine strategies only (it needs SingleDeviceStrategy's "
                'model, optim_wrapper, logger, seed, schedulers and resume)')
        for name, method in vars(ShardedCheckpointing).items():
            if not callable(method) or name.startswith('__'):
                continue
            owner = next(k for k in cls.__mro__ if name in vars(k))
            if not issubclass(owner, ShardedCheckpointing):
                setattr(cls, name, method)  # whatever the order of bases

    # -- state dicts -------------------------------------------------------
    def _options(self, full: bool, strict: bool = True) -> Any:
        """Full: gathered into host memory on rank 0 (``cpu_offload``);
        a model on the CPU keeps its tensors where they are (FSDP1's
        offload of CPU tensors crashes in torch 2.13: a segmentation fault
        in its state-dict hook)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions
        on_cpu = all(p.device.type == 'cpu' for p in self.model.parameters())
        return StateDictOptions(
            full_state_dict=full,
            cpu_offload=full and not on_cpu,
            strict=strict)

    def _optimizer(self) -> torch.optim.Optimizer:
        return self.optim_wrapper.optimizer

    def model_state_dict(self) -> dict:
        """The model's state dict in the strategy's format (full: on rank
        0, empty on the others)."""
        from torch.distributed.checkpoint.state_dict import \
            get_model_state_dict
        return get_model_state_dict(
            self.model,
            options=self._options(self.checkpoint_format == 'full'))

    def optim_state_dict(self) -> dict:
        """The optimizer's state dict (keyed by parameter names) and the
        optimizer wrapper's own entries (AMP's ``loss_scaler``)."""
        from torch.distributed.checkpoint.state_dict import \
            get_optimizer_state_dict
        state = get_optimizer_state_dict(
            self.model,
            self._optimizer(),
            options=self._options(self.checkpoint_format == 'full'))
        for key, value in self.optim_wrapper.state_dict().items():
            if key not in OPTIMIZER_KEYS:
                state[key] = value
        return state

    def load_model_state_dict(self,
                              state_dict: dict,
                              *,
                              strict: bool = False,
                              revise_keys: list = [(r'^module.', '')]) -> None:
        """Load a full model state dict (every rank holds it) into the
        sharded model; missing and unexpected keys are logged as mmengine
        logs them (``strict=False``) or raise."""
        from torch.distributed.checkpoint.state_dict import \
            set_model_state_dict
        state_dict = revise_state_dict_keys(state_dict, revise_keys)
        log_incompatible_keys(
            self.logger,
            set_model_state_dict(
                self.model,
                state_dict,
                options=self._options(True, strict=strict)))

    def load_optim_state_dict(self, state_dict: dict) -> None:
        """Load a full optimizer state dict (as :meth:`optim_state_dict`
        writes it) and the wrapper's own entries (only those where a
        sharded checkpoint's resume loaded the shards already)."""
        from torch.distributed.checkpoint.state_dict import \
            set_optimizer_state_dict
        if isinstance(state_dict, _LoadedShards):
            self.load_optim_state_dict_extras(state_dict)
            return
        state_dict = dict(state_dict)
        optimizer = {k: state_dict.pop(k) for k in OPTIMIZER_KEYS}
        set_optimizer_state_dict(
            self.model,
            self._optimizer(),
            optimizer,
            options=self._options(True))
        self.load_optim_state_dict_extras(state_dict)

    # -- files -------------------------------------------------------------
    def save_checkpoint(self,
                        filename: str,
                        *,
                        save_optimizer: bool = True,
                        save_param_scheduler: bool = True,
                        extra_ckpt: Optional[dict] = None,
                        callback: Optional[Callable] = None) -> None:
        """Save on every rank (a collective): rank 0 writes one file of full
        tensors, or every rank its shards into the directory
        ``filename``."""
        import mmengine
        from mmengine.dist import barrier, get_rank
        checkpoint: dict = {'state_dict': self.model_state_dict()}
        if save_optimizer and hasattr(self, 'optim_wrapper'):
            checkpoint['optimizer'] = self.optim_state_dict()
        if save_param_scheduler and hasattr(self, 'param_schedulers'):
            checkpoint['param_schedulers'] = self.scheduler_state_dict()
        extra_ckpt = dict(extra_ckpt or {})
        # mmengine's meta entries; its SingleDeviceStrategy.save_checkpoint
        # writes them inline beside a rank-0-only save of unsharded
        # tensors, which cannot be called for a sharded model
        extra_ckpt.setdefault('meta', {}).update(
            seed=self.seed,
            time=time.strftime('%Y%m%d_%H%M%S', time.localtime()),
            mmengine=mmengine.__version__)
        checkpoint.update(extra_ckpt)
        if callback is not None:
            callback(checkpoint)
        if self.checkpoint_format == 'full':
            refuse_together(checkpoint, filename)  # rank 0 holds the tensors
            if get_rank() == 0:
                from mmengine.runner.checkpoint import save_checkpoint
                save_checkpoint(checkpoint, filename)
            barrier()  # the file exists when any rank returns
            return
        self._save_sharded(filename, checkpoint)

    def _save_sharded(self, path: str, checkpoint: dict) -> None:
        import torch.distributed.checkpoint as dcp
        from mmengine.dist import barrier, get_rank, get_world_size
        sharded = {
            k: checkpoint.pop(k)
            for k in SHARDED_KEYS if k in checkpoint
        }
        optimizer = sharded.get('optimizer', {})
        wrapper_own = {
            k: optimizer.pop(k)
            for k in list(optimizer) if k not in OPTIMIZER_KEYS
        }
        checkpoint['optimizer_wrapper'] = wrapper_own
        refuse_together(checkpoint, osp.join(path, EXTRA))
        if get_rank() == 0:
            os.makedirs(path, exist_ok=True)
            torch.save(checkpoint, osp.join(path, EXTRA))
        barrier()
        dcp.save(sharded, checkpoint_id=path)
        if get_rank() == 0:  # written last: a complete directory
            with open(osp.join(path, MARKER), 'w') as f:
                json.dump(
                    dict(
                        format='torch.distributed.checkpoint',
                        world_size=get_world_size(),
                        sharded=list(sharded),
                        extra=EXTRA), f)
        barrier()

    def _read_checkpoint(self, filename: str,
                         map_location: Any) -> Tuple[dict, bool]:
        """(checkpoint, is_sharded); a sharded one without its tensors."""
        if osp.isdir(filename) and not is_sharded_checkpoint(filename):
            raise ValueError(
                f'{filename!r} is a directory but not an mmstats sharded '
                f'checkpoint (no {MARKER}): an mmengine FSDPStrategy '
                "checkpoint of 'local' state dicts (rank*.pth) loads under "
                "mmengine's FSDPStrategy with the same number of processes "
                'only')
        if is_sharded_checkpoint(filename):
            return read_extra(filename), True
        from mmengine.runner.checkpoint import _load_checkpoint
        if map_location == 'default':
            map_location = 'cpu'
        return _load_checkpoint(filename, map_location=map_location), False

    def _load_sharded(self, path: str, with_optimizer: bool,
                      strict: bool) -> None:
        """DCP's load into this rank's shards (any world size)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict, get_optimizer_state_dict,
            set_model_state_dict, set_optimizer_state_dict)
        options = self._options(False, strict=strict)
        state = {
            'state_dict': get_model_state_dict(self.model, options=options)
        }
        if with_optimizer:
            state['optimizer'] = get_optimizer_state_dict(
                self.model, self._optimizer(), options=options)
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, state['state_dict'], options=options)
        if with_optimizer:
            set_optimizer_state_dict(
                self.model,
                self._optimizer(),
                state['optimizer'],
                options=options)

    def load_checkpoint(self,
                        filename: str,
                        *,
                        map_location: Any = 'cpu',
                        strict: bool = False,
                        revise_keys: list = [(r'^module.', '')],
                        callback: Optional[Callable] = None) -> dict:
        """Load the weights of either format (any world size), on every
        rank; returns the rest of the checkpoint. Called by :meth:`resume`
        (mmengine's), it loads strictly, the keys as saved, and a sharded
        checkpoint's optimizer shards with the model's (one DCP load)."""
        resuming = getattr(self, '_resuming', None)
        if resuming is None:
            self.logger.info(f'Load checkpoint from {filename}')
        else:  # mmengine's resume said 'Resume checkpoint from'
            strict, revise_keys = True, []
        checkpoint, sharded = self._read_checkpoint(filename, map_location)
        if callback is not None:
            callback(checkpoint)
        if not sharded:
            self.load_model_state_dict(
                checkpoint.pop('state_dict'),
                strict=strict,
                revise_keys=revise_keys)
            return checkpoint
        with_optimizer = resuming is not None and resuming.optimizer
        self._load_sharded(
            filename, with_optimizer=with_optimizer, strict=strict)
        if with_optimizer:
            checkpoint['optimizer'] = _LoadedShards(
                checkpoint.pop('optimizer_wrapper', {}))
        return checkpoint

    def resume(self,
               filename: str,
               *,
               resume_optimizer: bool = True,
               resume_param_scheduler: bool = True,
               map_location: Any = 'default',
               callback: Optional[Callable] = None) -> dict:
        """mmengine's resume (``SingleDeviceStrategy.resume``: the
        optimizer, the schedulers, the seed, gradient accumulation's
        counter), its reading and loading through this class's methods, so
        that either format resumes (a sharded one on any world size)."""
        from mmengine._strategy import SingleDeviceStrategy
        self._resuming = _Resuming(resume_optimizer)
        try:
            return SingleDeviceStrategy.resume(
                self,
                filename,
                resume_optimizer=resume_optimizer,
                resume_param_scheduler=resume_param_scheduler,
                map_location=map_location,
                callback=callback)
        finally:
            self._resuming = None

    def load_optim_state_dict_extras(self, own: dict) -> None:
        """The optimizer wrapper's own entries (AMP's ``loss_scaler``,
        ``base_param_settings``). mmengine's ``AmpOptimWrapper.
        load_state_dict`` cannot be called for them: it loads the
        optimizer's state in the same call, by parameter index, and the
        state here is keyed by names and loaded through torch's
        ``set_optimizer_state_dict``; so its two entries are loaded here,
        as it loads them."""
        if 'loss_scaler' in own:
            self.optim_wrapper.loss_scaler.load_state_dict(own['loss_scaler'])
        if 'base_param_settings' in own:
            self.optim_wrapper.base_param_settings = own['base_param_settings']


class _Resuming:
    """While mmengine's resume runs: it asked for the optimizer or not."""

    def __init__(self, optimizer: bool) -> None:
        self.optimizer = optimizer


class _LoadedShards(dict):
    """The ``optimizer`` entry of a sharded checkpoint being resumed: DCP
    already loaded the optimizer's shards with the model's; the dict holds
    the wrapper's own entries only."""
