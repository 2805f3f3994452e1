# Copyright (c) mmstats contributors. All rights reserved.
"""Argument checks shared by mmstats' public classes and functions.

The same mistake gets the same answer everywhere: a wrong **type** raises
``TypeError``, a wrong **value** of the right type raises ``ValueError``,
and the message names the owner, the argument, what it must be (with an
example of the fix) and what was given::

    Collector: max_names must be a positive int (e.g. max_names=4096),
    got True of type bool

Types are checked, not equality: ``0 == False`` and ``1.0 == 1``, but
``interval=True`` or ``keep_previous=1`` are mistakes. Every checker returns
the value it accepts (an int for integers of any integral type).

Mistakes beyond one argument get the fix too: a misspelt keyword names the
closest argument (:func:`check_keywords`, on every mmstats hook), a second
instance of a hook names both (:func:`refuse_second_instance`), and a
regular expression's ``|``-alternative that matches nothing is found by
:func:`unmatched_alternatives`.

No torch or mmengine import: ``mmstats/stats``, ``mmstats/precise_bn`` and
``mmstats/hooks`` all use it.
"""
import difflib
import functools
import inspect
import numbers
import re
from typing import (Any, Callable, List, Mapping, Optional, Pattern, Sequence,
                    Tuple, TypeVar)

__all__ = [
    'check_bool', 'check_positive_int', 'check_log_interval', 'check_real',
    'check_choice', 'check_str', 'check_names', 'compile_regex',
    'scope_inline_flags', 'check_keywords', 'refuse_second_instance',
    'split_alternatives', 'unmatched_alternatives', 'keywords_text',
    'deprecation_message'
]

ClassT = TypeVar('ClassT', bound=type)

_GLOBAL_FLAGS = re.compile(r'\(\?([aiLmsux]+)\)')


def _got(value: Any) -> str:
    """``got <value> of type <type>``: what every TypeError says."""
    return f'got {value!r} of type {type(value).__name__}'


def check_bool(owner: str,
               name: str,
               value: Any,
               none_ok: bool = False,
               meaning: str = '') -> Optional[bool]:
    """``value`` if it is True or False (or None with ``none_ok``), else
    TypeError. ``meaning`` (e.g. ``'None follows the train loop'``) is put
    into the message.

    Example:
        >>> check_bool('MyHook', 'at_end', True)
        True
        >>> check_bool('MyHook', 'at_end', 1)
        Traceback (most recent call last):
        TypeError: MyHook: at_end must be True or False, got 1 of type int; \
write at_end=True or at_end=False
    """
    if type(value) is bool or (none_ok and value is None):
        return value
    what = 'None or True or False' if none_ok else 'True or False'
    fix = f'; write {name}=True or {name}=False'
    if none_ok:
        fix = f'; write {name}=None, {name}=True or {name}=False'
    raise TypeError(f'{owner}: {name} must be {what}'
                    f'{f" ({meaning})" if meaning else ""}, {_got(value)}'
                    f'{fix}')


def check_positive_int(owner: str,
                       name: str,
                       value: Any,
                       example: Any = None,
                       none_ok: bool = False,
                       meaning: str = '') -> Optional[int]:
    """``value`` as an int if it is a positive integer (not a bool), or None
    with ``none_ok``. A non-integer is a TypeError, an integer below 1 a
    ValueError.

    Example:
        >>> check_positive_int('MyHook', 'interval', 10, example=10)
        10
        >>> check_positive_int('MyHook', 'interval', 0, example=10)
        Traceback (most recent call last):
        ValueError: MyHook: interval must be a positive int (e.g. \
interval=10), got 0
    """
    if none_ok and value is None:
        return None
    what = 'None or a positive int' if none_ok else 'a positive int'
    notes = [meaning] if meaning else []
    if example is not None:
        notes.append(f'e.g. {name}={example!r}')
    if notes:
        what += f' ({"; ".join(notes)})'
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f'{owner}: {name} must be {what}, {_got(value)}')
    if value < 1:
        raise ValueError(f'{owner}: {name} must be {what}, got {value!r}')
    return int(value)


def check_log_interval(owner: str, interval: Any) -> Optional[int]:
    """A publication ``interval``: None (LoggerHook's) or a positive int.

    Example:
        >>> check_log_interval('MyHook', None) is None
        True
        >>> check_log_interval('MyHook', 0)
        Traceback (most recent call last):
        ValueError: MyHook: interval must be None or a positive int (None: \
the LoggerHook interval; e.g. interval=10), got 0
    """
    return check_positive_int(
        owner,
        'interval',
        interval,
        example=10,
        none_ok=True,
        meaning='None: the LoggerHook interval')


def check_real(owner: str, name: str, value: Any,
               accept: Callable[[Any], bool], what: str) -> Any:
    """``value`` if it is a real number (not a bool) that ``accept``
    takes: another type is a TypeError, a number ``accept`` refuses a
    ValueError. ``what`` says what it must be, with an example of the fix.

    Example:
        >>> what = 'a finite number > 1 (e.g. factor=4.0)'
        >>> above_one = lambda v: v > 1 and v != float('inf')
        >>> check_real('MyHook', 'factor', 4, above_one, what)
        4
        >>> check_real('MyHook', 'factor', 0.5, above_one, what)
        Traceback (most recent call last):
        ValueError: MyHook: factor must be a finite number > 1 (e.g. \
factor=4.0), got 0.5
    """
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f'{owner}: {name} must be {what}, {_got(value)}')
    if not accept(value):
        raise ValueError(f'{owner}: {name} must be {what}, got {value!r}')
    return value


def check_choice(owner: str, name: str, value: Any,
                 choices: Sequence[str]) -> str:
    """``value`` if it is one of the strings ``choices``: another type is a
    TypeError, another string a ValueError.

    Example:
        >>> check_choice('MyHook', 'mode', 'warn', ('warn', 'raise'))
        'warn'
    """
    what = f'one of {tuple(choices)}'
    if not isinstance(value, str):
        raise TypeError(f'{owner}: {name} must be {what}, {_got(value)}')
    if value not in choices:
        raise ValueError(f'{owner}: {name} must be {what}, got {value!r}')
    return value


def check_str(owner: str, name: str, value: Any, example: str) -> str:
    """``value`` if it is a non-empty str: another type is a TypeError, an
    empty string a ValueError.

    Example:
        >>> check_str('MyHook', 'prefix', 'stats', 'stats')
        'stats'
    """
    what = f'a non-empty str (e.g. {name}={example!r})'
    if not isinstance(value, str):
        raise TypeError(f'{owner}: {name} must be {what}, {_got(value)}')
    if not value:
        raise ValueError(f'{owner}: {name} must be {what}, got {value!r}')
    return value


def check_names(owner: str, name: str, value: Any,
                allowed: Callable[[Any], bool], what: str) -> tuple:
    """``tuple(value)`` if it is a non-empty sequence (not a str) of items
    that ``allowed`` accepts: another type is a TypeError, an empty one or
    an unknown item a ValueError. ``what`` says what it must be, with an
    example of the fix.

    Example:
        >>> what = 'a non-empty list of ("mean", "max"), e.g. ("mean", )'
        >>> known = {'mean', 'max'}.__contains__
        >>> check_names('MyHook', 'stats', ['max'], known, what)
        ('max',)
        >>> check_names('MyHook', 'stats', 'max', known, what)
        Traceback (most recent call last):
        TypeError: MyHook: stats must be a non-empty list of ("mean", "max"), \
e.g. ("mean", ), got 'max' of type str
    """
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f'{owner}: {name} must be {what}, {_got(value)}')
    if not value or not all(allowed(item) for item in value):
        raise ValueError(f'{owner}: {name} must be {what}, got {value!r}')
    return tuple(value)


def scope_inline_flags(regex: str) -> str:
    """Turn leading global inline flags into scoped ones.

    ``'(?i)loss'`` becomes ``'(?i:loss)'``, so the pattern can be embedded
    in a larger one (Python rejects global flags that are not at the start
    of the whole pattern).

    Example:
        >>> scope_inline_flags('(?i)loss'), scope_inline_flags('loss')
        ('(?i:loss)', 'loss')
    """
    match = _GLOBAL_FLAGS.match(regex)
    if match is None:
        return regex
    return f'(?{match.group(1)}:{regex[match.end():]})'


def compile_regex(owner: str,
                  name: str,
                  value: Any,
                  prepare: Callable[[str], str] = lambda s: s,
                  hint: str = '',
                  pattern_ok: bool = False) -> Pattern:
    """``re.compile(prepare(value))`` for a str ``value`` (a compiled
    pattern is returned as it is with ``pattern_ok``): another type is a
    TypeError, an invalid expression a ValueError with ``re``'s reason and
    ``hint``.

    Example:
        >>> compile_regex('MyHook', 'regex', '(?i)loss',
        ...               prepare=scope_inline_flags).pattern
        '(?i:loss)'
        >>> compile_regex('MyHook', 'regex', 'loss(')  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: MyHook: regex 'loss(' is not a valid regular expression ...
    """
    if pattern_ok and isinstance(value, Pattern):
        return value
    if not isinstance(value, str):
        raise TypeError(f'{owner}: {name} must be a str (a regular '
                        f'expression, e.g. {name}=".*"), {_got(value)}')
    try:
        return re.compile(prepare(value))
    except re.error as e:
        raise ValueError(f'{owner}: {name} {value!r} is not a valid regular '
                         f'expression ({e}){hint}') from None


def _closest(name: str, choices: Sequence[str]) -> str:
    """``'did you mean X? '`` with the closest of ``choices``, or ''."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f'did you mean {close[0]}? ' if close else ''


def check_keywords(cls: ClassT) -> ClassT:
    """Class decorator: a keyword that ``cls.__init__`` does not take
    raises ``TypeError`` naming the closest argument it takes, before
    ``__init__`` runs (for a direct call and for a registry's ``build``
    alike). The signature stays the original one (``inspect.signature``,
    the docs); an ``__init__`` with ``**kwargs`` is left as it is.

    Example:
        >>> @check_keywords
        ... class MyHook:
        ...     def __init__(self, num_samples=8, interval=1):
        ...         self.num_samples = num_samples
        >>> MyHook(num_samples=4).num_samples
        4
        >>> MyHook(num_sample=4)
        Traceback (most recent call last):
        TypeError: MyHook: unexpected keyword argument 'num_sample'; did you \
mean num_samples? MyHook takes num_samples, interval
    """
    init = cls.__init__
    params = list(inspect.signature(init).parameters.values())[1:]  # self
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return cls
    names = [
        p.name for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    owner = cls.__name__

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in names:
                raise TypeError(
                    f'{owner}: unexpected keyword argument {name!r}; '
                    f'{_closest(name, names)}{owner} takes '
                    f'{", ".join(names) or "no arguments"}')
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def refuse_second_instance(owner: str, hooks: Sequence[Any],
                           kind: type) -> None:
    """Raise ``RuntimeError`` if ``hooks`` (a runner's ``runner.hooks``,
    sorted by priority) hold more than one ``kind``, naming each one's
    position and priority and the fix. Called by every mmstats hook in
    ``before_run``: two of them in one run would report, publish or
    recompute the same things twice.

    Example:
        >>> class MyHook:
        ...     priority = 'NORMAL'
        >>> refuse_second_instance('MyHook', [MyHook()], MyHook)
        >>> refuse_second_instance('MyHook', [MyHook(), 1, MyHook()], MyHook)
        Traceback (most recent call last):
        RuntimeError: MyHook: 2 instances in one run, runner.hooks[0] \
(priority NORMAL) and runner.hooks[2] (priority NORMAL); a run takes one: \
keep one dict(type='mmstats.MyHook', ...) in custom_hooks, with the \
arguments of both
    """
    found = [(i, hook) for i, hook in enumerate(hooks)
             if isinstance(hook, kind)]
    if len(found) < 2:
        return
    where = [
        f'runner.hooks[{i}] (priority '
        f'{getattr(hook.priority, "name", hook.priority)})'
        for i, hook in found
    ]
    raise RuntimeError(
        f'{owner}: {len(found)} instances in one run, '
        f'{", ".join(where[:-1])} and {where[-1]}; a run takes one: keep '
        f"one dict(type='mmstats.{kind.__name__}', ...) in custom_hooks, "
        'with the arguments of both')


def _global_flags(regex: str) -> Tuple[str, str]:
    """``(flags, rest)``: the leading global inline flags of ``regex``
    (``'(?i)'``, or '') and the pattern after them."""
    flags = ''
    match = _GLOBAL_FLAGS.match(regex)
    while match is not None:
        flags += match.group(1)
        regex = regex[match.end():]
        match = _GLOBAL_FLAGS.match(regex)
    return (f'(?{flags})' if flags else ''), regex


def split_alternatives(regex: str) -> List[str]:
    r"""The top-level ``|``-alternatives of ``regex``, as written: a ``|``
    inside parentheses, a character class, after a backslash or (verbose
    mode) in a comment does not split. Leading global inline flags
    (``(?i)``) are left out; they apply to every alternative.

    Example:
        >>> split_alternatives(r'(?i)backbone\.(stem|layer\d)|[|]|a\|b')
        ['backbone\\.(stem|layer\\d)', '[|]', 'a\\|b']
    """
    flags, regex = _global_flags(regex)
    verbose = 'x' in flags
    parts, start, depth, i = [], 0, 0, 0
    class_start = None  # where a character class's items begin
    while i < len(regex):
        char = regex[i]
        if char == '\\':
            i += 2
            continue
        if class_start is not None:
            if char == ']' and i > class_start:  # '[]' and '[^]': literal
                class_start = None
        elif char == '[':
            class_start = i + 1 + (regex[i + 1:i + 2] == '^')
        elif char == '#' and verbose:
            end = regex.find('\n', i)
            i = len(regex) if end < 0 else end
            continue
        elif char == '(':
            depth += 1
        elif char == ')':
            depth -= 1
        elif char == '|' and depth == 0:
            parts.append(regex[start:i])
            start = i + 1
        i += 1
    parts.append(regex[start:])
    return parts


def unmatched_alternatives(regex: str, names: Sequence[str]) -> List[str]:
    r"""The top-level alternatives of ``regex`` (:func:`split_alternatives`)
    that fullmatch none of ``names``, when there are several; an
    alternative that cannot be compiled alone (a back reference into
    another one) is not judged.

    Example:
        >>> names = ['backbone', 'backbone.stem', 'head']
        >>> unmatched_alternatives(r'backbone\.layer\d|head', names)
        ['backbone\\.layer\\d']
        >>> unmatched_alternatives(r'(?i)HEAD|backbone\.(stem|x)', names)
        []
    """
    flags, _ = _global_flags(regex)
    parts = split_alternatives(regex)
    if len(parts) < 2:
        return []
    unmatched = []
    for part in parts:
        try:
            pattern = re.compile(flags + part)
        except re.error:
            continue
        if not any(pattern.fullmatch(name) for name in names):
            unmatched.append(part)
    return unmatched


def keywords_text(keywords: Mapping[str, Any]) -> str:
    """``keywords`` as they are written in a call.

    Example:
        >>> keywords_text(dict(spike_factor=8, on_spike='raise'))
        "spike_factor=8, on_spike='raise'"
    """
    return ', '.join(f'{k}={v!r}' for k, v in keywords.items())


def deprecation_message(owner: str, keywords: Mapping[str, Any],
                        new_form: str) -> str:
    """What an mmengine WARNING says of deprecated ``keywords``, naming
    their ``new_form`` (mmengine's hooks warn so about deprecated
    arguments: it is in the log, where a ``DeprecationWarning`` is hidden
    by Python's default filters).

    Example:
        >>> deprecation_message('MyHook', dict(at_end=True), "when='end'")
        "MyHook: at_end=True is deprecated (accepted until the next \
release); write when='end'"
    """
    verb = 'is' if len(keywords) == 1 else 'are'
    return (f'{owner}: {keywords_text(keywords)} {verb} deprecated (accepted '
            f'until the next release); write {new_form}')
