# Copyright (c) mmstats contributors. All rights reserved.
"""Validation and conversion of reported values (the slow paths of
:func:`~mmstats.stats.report`): every value that cannot become float64
fails here, at the ``report()`` call, naming the statistic."""
import numbers
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ['add_value', 'name_error', 'value_error', 'check_tensor']


def name_error(name: Any) -> TypeError:
    return TypeError(f'report(): the name must be a str, got '
                     f'{type(name).__name__} {name!r}')


def value_error(name: str, value: Any, why: str = '') -> TypeError:
    why = why or (f'must be a real number, sequence of real numbers, numpy '
                  f'array or tensor, got {type(value).__name__}')
    return TypeError(f'report({name!r}): the value {why}')


def to_float(name: str, value: Any) -> float:
    """``float(value)`` or a ValueError naming ``name`` (ints beyond the
    float64 range, e.g. ``10**400``)."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f'report({name!r}): {value!r:.40} is beyond the '
                         f'float64 range') from None


def check_tensor(name: str, value: torch.Tensor) -> None:
    """Reject tensors that cannot be read as real float64 values."""
    if value.layout is not torch.strided:
        raise value_error(
            name, value, f'must be a dense (strided) tensor, '
            f'got layout {value.layout}')
    if value.is_meta:
        raise value_error(name, value, 'is a meta tensor (it has no data)')
    if value.is_quantized or value.is_complex():
        raise value_error(name, value, f'must be a real tensor, got '
                          f'{value.dtype}')


def add_value(store: Any, name: str, value: Any) -> None:
    """Add any value that is not a float or a plain tensor to ``store``
    (a :class:`~mmstats.stats.reporting.PendingStore`)."""
    if isinstance(value, torch.Tensor):
        store.add_tensor(name, value)
    elif isinstance(value, (str, bytes, dict)) or value is None:
        raise value_error(name, value)
    elif type(value) is int or isinstance(value, (bool, np.bool_)):
        store.add_numbers(name, [to_float(name, value)])
    elif isinstance(value, numbers.Real):  # np.float32, np.int64, Fraction..
        store.add_numbers(name, [to_float(name, value)])
    elif isinstance(value, np.ndarray):
        _add_array(store, name, value)
    elif isinstance(value, (Sequence, set, frozenset)):
        _add_sequence(store, name, list(value))
    else:
        raise value_error(name, value)


def _add_array(store: Any, name: str, value: np.ndarray) -> None:
    if value.dtype.kind not in 'biuf':
        raise value_error(
            name, value, f'must be a real numpy array, got '
            f'dtype {value.dtype}')
    if value.size == 0:
        store.empty.add(name)
    else:  # np.array copies: later in-place changes cannot leak in
        values = np.array(value, dtype=np.float64).ravel()
        store.add_tensor(name, torch.from_numpy(values))


def _add_sequence(store: Any, name: str, values: list) -> None:
    if not values:
        store.empty.add(name)
    elif all(type(v) is float for v in values):
        store.add_numbers(name, values)
    elif all(type(v) in (float, int, bool) for v in values):
        store.add_numbers(name, [to_float(name, v) for v in values])
    elif all(isinstance(v, torch.Tensor) for v in values):
        for v in values:
            check_tensor(name, v)
        for v in values:
            store.add_tensor(name, v)
    else:  # nested sequences, numpy scalars: numpy decides, strictly
        try:
            array = np.asarray(values)
        except (TypeError, ValueError, OverflowError):
            raise value_error(
                name, values, 'is a sequence that is not a '
                'rectangular array of real numbers') from None
        if array.dtype.kind not in 'biuf':  # None, strings, objects
            raise value_error(
                name, values, 'is a sequence that holds '
                'something other than real numbers')
        _add_array(store, name, array)
