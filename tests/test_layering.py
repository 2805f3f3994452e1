"""The layering of docs/architecture.md: the core packages (``stats``, the
report side; ``precise_bn``, ``module_stats``, ``health``, ``throughput``,
``wrappers``) import nothing of mmengine's Runner or of the hooks, and no
module imports from a layer above its own. Runner-facing code lives under
``mmstats/hooks`` and, one layer below it, ``mmstats/publish``: what the
hooks share of a Runner (the publication schedule, the keys and the log
line, the refused strategies, the loaders' worker plumbing), which reads
the attributes of the runner a hook passes it but holds no hook (no
``Hook`` subclass, nothing registered) and, like the hooks, no tensor math
and no collective. Hooks stay thin (no tensor math, no collective, no hook
importing another; at most two files per hook, plus ``interfaces.py``)."""
import ast
import pathlib
import re

import pytest

import mmstats

ROOT = pathlib.Path(mmstats.__file__).parent
CORE_PACKAGES = ('stats', 'precise_bn', 'module_stats', 'health', 'throughput',
                 'wrappers')
CORES = sorted(p for core in CORE_PACKAGES for p in (ROOT / core).glob('*.py'))
FORBIDDEN = ('mmengine.runner', 'mmstats.hooks', 'mmengine.hooks')


def imported_modules(path: pathlib.Path) -> list:
    """Absolute names of the modules ``path`` imports (relative ones
    resolved against its package)."""
    package = f'mmstats.{path.parent.name}'
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit('.', node.level - 1)[0]
                names.append(f'{base}.{node.module}' if node.module else base)
            else:
                names.append(node.module)
    return names


@pytest.mark.parametrize(
    'path', CORES, ids=lambda p: f'{p.parent.name}/'
    f'{p.name}')
def test_cores_do_not_import_runners_or_hooks(path):
    bad = [
        name for name in imported_modules(path)
        if name.startswith(FORBIDDEN) or name == 'mmstats.hooks'
    ]
    assert not bad, f'{path.name} imports {bad}'


def test_the_check_sees_relative_imports(tmp_path):
    fake = tmp_path / 'stats' / 'x.py'
    fake.parent.mkdir()
    fake.write_text('from ..hooks import StatsCollectorHook\n'
                    'from mmengine.runner import Runner\n')
    assert imported_modules(fake) == ['mmstats.hooks', 'mmengine.runner']


# -- import circles ---------------------------------------------------------
PACKAGE = sorted(ROOT.rglob('*.py'))


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def import_graph(paths: list) -> dict:
    """``{module: {mmstats modules it imports, anywhere in its body}}``;
    ``from package import name`` counts as importing ``package.name`` when
    that is a module."""
    modules = {module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == '__init__.py' else name.rsplit('.',
                                                                      1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    root = package.rsplit('.', node.level - 1)[0]
                    base = f'{root}.{base}' if base else root
                targets = [
                    f'{base}.{a.name}'
                    if f'{base}.{a.name}' in modules else base
                    for a in node.names
                ]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def circles(graph: dict) -> list:
    """Every strongly connected group of more than one module, and every
    module that imports itself (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


# A package's __init__ re-exporting its modules is not a circle of code:
# only modules that are not packages count.
def test_no_import_circle_in_mmstats():
    graph = import_graph(PACKAGE)
    graph = {
        name: {
            t
            for t in edges if not (ROOT.parent / t.replace('.', '/') /
                                   '__init__.py').exists()
        }
        for name, edges in graph.items()
        if not (ROOT.parent / name.replace('.', '/') / '__init__.py').exists()
    }
    assert circles(graph) == []


def test_the_circle_check_finds_a_circle(tmp_path):
    pkg = tmp_path / 'mmstats' / 'stats'
    pkg.mkdir(parents=True)
    (pkg / 'a.py').write_text('from .b import x\n')
    (pkg / 'b.py').write_text('def f():\n    from mmstats.stats.a import y\n')
    (pkg / 'c.py').write_text('from . import a\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path / 'mmstats'
    try:
        graph = import_graph(sorted(ROOT.rglob('*.py')))
    finally:
        ROOT = saved
    assert graph['mmstats.stats.c'] == {'mmstats.stats.a'}
    assert circles(graph) == [['mmstats.stats.a', 'mmstats.stats.b']]


# -- process state ----------------------------------------------------------
def test_no_module_keeps_state_in_globals():
    """State has one owner: no ``global`` statement anywhere in mmstats,
    and the report side (``stats/``, ``training_stats``) keeps no module
    level list, dict or set (the Reporter's fields hold it)."""
    offenders = []
    for path in PACKAGE:
        tree = ast.parse(path.read_text())
        offenders += [
            f'{path.name}: global {", ".join(node.names)}'
            for node in ast.walk(tree) if isinstance(node, ast.Global)
        ]
        if path.parent.name != 'stats' and path.name != 'training_stats.py':
            continue
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(
                    node.value, (ast.List, ast.Dict, ast.Set, ast.ListComp,
                                 ast.DictComp, ast.SetComp)):
                if getattr(node, 'targets', [None])[0] is not None and any(
                        isinstance(t, ast.Name) and t.id == '__all__'
                        for t in node.targets):
                    continue
                offenders.append(f'{path.name}:{node.lineno}')
    assert not offenders, offenders


STORE_FIELDS = re.compile(
    r'(^|\.)(store|sketches)\.(numbers|tensors|rows|empty|counts|lock)\b')


def state_writes(paths: list, owners: set) -> list:
    """Assignments to ``REPORTER``'s fields, and any use of a store's
    containers, outside ``owners``."""
    found = []
    for path in paths:
        if path in owners:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = getattr(node, 'targets', None) or [node.target]
                found += [
                    f'{path.name}:{node.lineno} {ast.unparse(t)}'
                    for t in targets if ast.unparse(t).startswith('REPORTER.')
                ]
            if isinstance(node, ast.Attribute) and STORE_FIELDS.search(
                    ast.unparse(node)):
                found.append(f'{path.name}:{node.lineno} {ast.unparse(node)}')
    return found


def test_report_side_state_is_written_from_two_modules():
    """Only ``stats/reporting.py`` (the Reporter) and ``stats/pending.py``
    (the stores) change the report side's state; elsewhere it is read, or
    changed through their methods."""
    owners = {ROOT / 'stats' / 'reporting.py', ROOT / 'stats' / 'pending.py'}
    assert state_writes(PACKAGE, owners) == []


def test_the_state_check_sees_a_foreign_write(tmp_path):
    fake = tmp_path / 'values.py'
    fake.write_text('def add(store, name):\n    store.empty.add(name)\n'
                    'REPORTER.enabled = True\n')
    assert [w.split()[1] for w in state_writes([fake], set())
            ] == ['REPORTER.enabled', 'store.empty.add', 'store.empty']


# -- layers: nothing runs back up -------------------------------------------
#: mmstats' layers, lowest first. A module imports from its own package or
#: module, or from a lower layer: never from a layer above, never from
#: another package of its own layer.
LAYERS = (
    ('mmstats.version', 'mmstats.utils'),
    ('mmstats.dist', 'mmstats.registry', 'mmstats.random_state'),
    ('mmstats.sharding', 'mmstats.run_description', 'mmstats.checkpoints'),
    ('mmstats.stats', ),  # the report side
    ('mmstats.health', 'mmstats.throughput', 'mmstats.precise_bn',
     'mmstats.wrappers', 'mmstats.training_stats'),
    ('mmstats.module_stats', ),
    ('mmstats.publish', ),  # what the hooks share of a Runner: no hook
    ('mmstats.hooks', 'mmstats.strategies'),  # the Runner-facing ones
    ('mmstats.launch', ),  # the launcher's set-up; the mmengine patches
    ('mmstats.analysis', ),  # the figures of a work dir (matplotlib)
    ('mmstats.tools', ),  # the launchers
)


def unit_of(module: str) -> tuple:
    """``(layer, unit)`` of an mmstats module; the root package is above
    every layer."""
    for layer, units in enumerate(LAYERS):
        for unit in units:
            if module == unit or module.startswith(unit + '.'):
                return layer, unit
    assert module == 'mmstats', f'{module} is in no layer of LAYERS'
    return len(LAYERS), module


def upward_imports(graph: dict) -> list:
    """``'importer -> imported'`` for every import into a higher layer or
    into another unit of the same layer."""
    found = []
    for name, edges in graph.items():
        layer, unit = unit_of(name)
        for target in sorted(edges):
            their_layer, their_unit = unit_of(target)
            if their_unit != unit and their_layer >= layer:
                found.append(f'{name} -> {target}')
    return found


def test_nothing_runs_back_up():
    assert upward_imports(import_graph(PACKAGE)) == []


def test_every_module_is_in_a_layer():
    assert all(unit_of(module_name(path)) for path in PACKAGE)


def test_the_layer_check_sees_an_import_going_up(tmp_path):
    graph = {
        'mmstats.stats.reporting': {'mmstats.health.spikes'},  # up
        'mmstats.health.spikes': {'mmstats.throughput'},  # sideways
        'mmstats.module_stats.norms': {'mmstats.health', 'mmstats.dist'},
        'mmstats.hooks.x_hook': {'mmstats.hooks.interfaces'},  # own package
        'mmstats.publish.schedule': {'mmstats.hooks.interfaces'},  # up
    }
    assert upward_imports(graph) == [
        'mmstats.stats.reporting -> mmstats.health.spikes',
        'mmstats.health.spikes -> mmstats.throughput',
        'mmstats.publish.schedule -> mmstats.hooks.interfaces'
    ]


# -- thin hooks -------------------------------------------------------------
HOOKS = sorted((ROOT / 'hooks').glob('*.py'))
MAX_HOOK_FILE_LINES = 500
MAX_FUNCTION_LINES = 60
#: Calls a hook leaves to the library packages. Called by any name
#: (``all_reduce(x)``, ``dist.all_reduce(x)``): the collectives and the
#: sharded sums; as a method or a ``torch.`` function (``x.sum()``,
#: ``torch.cat(...)``): tensor math. And every ``torch._foreach_*``.
COLLECTIVES_AND_SUMS = ('all_reduce', 'all_gather', 'all_gather_object',
                        'all_to_all', 'broadcast', 'broadcast_object_list',
                        'reduce', 'reduce_scatter', 'gather', 'scatter',
                        'barrier', 'segment_sum', 'segment_reduce',
                        'sum_squares', 'float64_dots', 'scaled_all_reduce',
                        'sum_all_reduce')
TENSOR_MATH = ('zeros', 'zeros_like', 'ones', 'ones_like', 'empty', 'full',
               'tensor', 'as_tensor', 'arange', 'stack', 'cat', 'concat',
               'sum', 'mean', 'std', 'var', 'sqrt', 'sqrt_', 'norm', 'mul',
               'mul_', 'add_', 'sub_', 'div', 'div_', 'matmul', 'einsum',
               'where', 'index_add', 'index_add_', 'clamp', 'clamp_min', 'abs',
               'amax', 'amin', 'flatten', 'view', 'reshape', 'to', 'double',
               'float', 'tolist', 'item')


def tensor_calls(path: pathlib.Path) -> list:
    """``'file:line call'`` of every call in ``path`` to a name of
    ``COLLECTIVES_AND_SUMS`` or ``TENSOR_MATH`` (see above)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(
            func, 'id', '')
        if (name in COLLECTIVES_AND_SUMS or name.startswith('_foreach_')
                or (isinstance(func, ast.Attribute) and name in TENSOR_MATH)):
            found.append(f'{path.name}:{node.lineno} {ast.unparse(func)}')
    return found


def test_hooks_hold_no_tensor_math_and_no_collective():
    assert [c for path in HOOKS for c in tensor_calls(path)] == []


PUBLISH = sorted((ROOT / 'publish').glob('*.py'))


def test_publish_holds_no_tensor_math_and_no_collective():
    """``mmstats/publish`` is the hooks' side of the Runner: the same rule
    as ``hooks/`` (and no copies or in-place arithmetic either)."""
    assert [
        c for path in PUBLISH
        for c in tensor_calls(path) + hook_tensor_calls(path)
    ] == []


def test_the_tensor_check_sees_math_and_collectives(tmp_path):
    fake = tmp_path / 'x_hook.py'
    fake.write_text('def f(x, dist, runner):\n'
                    '    all_reduce(x)\n    dist.all_gather(x)\n'
                    '    torch._foreach_norm([x])\n    y = x.sum()\n'
                    '    torch.cat([x])\n    sum([1, 2])\n'
                    '    runner.hooks.index(0)\n')
    assert [c.split()[1] for c in tensor_calls(fake)] == [
        'all_reduce', 'dist.all_gather', 'torch._foreach_norm', 'x.sum',
        'torch.cat'
    ]


#: Tensor methods a hook never calls: copies and in-place arithmetic
#: (``buf.clone()``, ``buf.copy_(other)``, ``x.add_(y)``...), whatever the
#: object is called. Swapping, copying or accumulating tensors is the
#: library's (``precise_bn.swap_bn_statistics``, a package's class).
HOOK_TENSOR_METHODS = ('clone', 'copy_', 'add_', 'mul_', 'div_', 'sub_',
                       'zero_', 'fill_')
#: ``torch.`` functions that do arithmetic: the four operations, powers and
#: roots, and the reductions. Only the spelling ``torch.<name>(...)`` is
#: looked for; ``torch.device(...)``, ``torch.no_grad()`` and the like are
#: not arithmetic and stay allowed.
HOOK_TORCH_ARITHMETIC = ('add', 'sub', 'subtract', 'mul', 'multiply', 'div',
                         'divide', 'true_divide', 'floor_divide', 'remainder',
                         'neg', 'abs', 'pow', 'sqrt', 'rsqrt', 'exp', 'log',
                         'sum', 'mean', 'prod', 'cumsum', 'max', 'min',
                         'maximum', 'minimum', 'clamp', 'lerp', 'matmul',
                         'dot')


def hook_tensor_calls(path: pathlib.Path) -> list:
    """``'file:line call'`` of every call in ``path`` to a method of
    ``HOOK_TENSOR_METHODS`` (on any object) or to a function of
    ``HOOK_TORCH_ARITHMETIC`` spelt ``torch.<name>``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)):
            continue
        func, name = node.func, node.func.attr
        on_torch = isinstance(func.value,
                              ast.Name) and func.value.id == 'torch'
        if name in HOOK_TENSOR_METHODS or (on_torch
                                           and name in HOOK_TORCH_ARITHMETIC):
            found.append(f'{path.name}:{node.lineno} {ast.unparse(func)}')
    return found


@pytest.mark.parametrize('path', HOOKS, ids=lambda p: p.name)
def test_hooks_copy_no_tensor_and_do_no_arithmetic(path):
    """Issue 47: a hook reads the runner, calls the library and publishes;
    no ``.clone()`` / ``.copy_()`` / in-place arithmetic / ``torch.``
    arithmetic in ``mmstats/hooks/`` (one case per file)."""
    assert hook_tensor_calls(path) == []


def test_the_hook_tensor_check_sees_copies_and_arithmetic(tmp_path):
    fake = tmp_path / 'x_hook.py'
    fake.write_text('def f(a, b, runner):\n'
                    '    tmp = a.clone()\n    a.copy_(b)\n'
                    '    runner.model.bn.running_var.fill_(1)\n'
                    '    torch.add(a, b)\n    torch.Tensor.zero_(a)\n'
                    '    torch.device("cpu")\n    torch.no_grad()\n'
                    '    copy.copy(a)\n    max(1, 2)\n'
                    '    runner.message_hub.update_scalar("k", 1)\n')
    assert [c.split()[1] for c in hook_tensor_calls(fake)] == [
        'a.clone', 'a.copy_', 'runner.model.bn.running_var.fill_', 'torch.add',
        'torch.Tensor.zero_'
    ]


def hook_imports(graph: dict) -> list:
    """``'hook -> hook'`` where a ``*_hook`` module imports another."""
    return [
        f'{name} -> {target}' for name, edges in graph.items()
        for target in sorted(edges) if name.endswith('_hook')
        and target.endswith('_hook') and target != name
    ]


def test_no_hook_imports_another_hook():
    assert hook_imports(import_graph(PACKAGE)) == []


def test_the_hook_import_check_sees_one(tmp_path):
    graph = {
        'mmstats.hooks.a_hook':
        {'mmstats.hooks.b_hook', 'mmstats.hooks.interfaces'},
        'mmstats.hooks': {'mmstats.hooks.a_hook'},  # the package exports
    }
    assert hook_imports(graph) == [
        'mmstats.hooks.a_hook -> mmstats.hooks.b_hook'
    ]


@pytest.mark.parametrize('path', HOOKS, ids=lambda p: p.name)
def test_no_hook_file_is_long(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_HOOK_FILE_LINES, f'{path.name}: {lines} lines'


def long_functions(path: pathlib.Path, limit: int) -> list:
    """``'file:line name (n lines)'`` of every function of ``path`` longer
    than ``limit`` lines: from its ``def`` to its last line, its docstring
    left out."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        lines = node.end_lineno - node.lineno + 1
        doc = node.body[0]
        if isinstance(doc, ast.Expr) and isinstance(
                doc.value, ast.Constant) and isinstance(doc.value.value, str):
            lines -= doc.end_lineno - doc.lineno + 1
        if lines > limit:
            found.append(f'{path.name}:{node.lineno} {node.name} '
                         f'({lines} lines)')
    return found


def test_no_function_in_mmstats_is_long():
    assert [
        f for path in PACKAGE for f in long_functions(path, MAX_FUNCTION_LINES)
    ] == []


def test_the_length_check_counts_code_not_docstrings(tmp_path):
    fake = tmp_path / 'x.py'
    fake.write_text('def short():\n    """One\n    two\n    three."""\n'
                    '    return 1\n\n\ndef long():\n    a = 1\n'
                    '    b = 2\n    return a + b\n')
    assert long_functions(fake, 3) == ['x.py:8 long (4 lines)']


# -- hooks/ holds hooks; publish/ holds none ---------------------------------
#: what ``mmstats/hooks`` holds beside the ``*_hook.py`` files
HOOK_PACKAGE_EXTRAS = ('__init__.py', 'interfaces.py')


def hook_files_beyond_two(paths: list) -> list:
    """Files of ``hooks/`` that are neither a hook, nor ``interfaces.py`` /
    ``__init__.py``, nor the one helper of a hook (``<name>_*.py`` beside
    ``<name>_hook.py``); and every hook with more than one helper."""
    names = {p.name for p in paths}
    hooks = {n[:-len('_hook.py')] for n in names if n.endswith('_hook.py')}
    found, helpers = [], {}
    for name in sorted(names - set(HOOK_PACKAGE_EXTRAS)):
        if name.endswith('_hook.py'):
            continue
        owner = next((h for h in hooks if name.startswith(h + '_')), None)
        if owner is None:
            found.append(name)
        else:
            helpers.setdefault(owner, []).append(name)
    return found + [
        f'{owner}_hook.py: {", ".join(files)}'
        for owner, files in sorted(helpers.items()) if len(files) > 1
    ]


def test_hooks_hold_hooks_and_their_helpers_only():
    """Issue 47: at most two files per hook (the hook and its own helper),
    plus ``interfaces.py``; what hooks share lives in ``mmstats/publish``."""
    assert hook_files_beyond_two(HOOKS) == []


def test_the_hook_file_check_sees_a_shared_module(tmp_path):
    names = ('__init__.py', 'interfaces.py', 'a_hook.py', 'a_args.py',
             'a_more.py', 'b_hook.py', 'schedule.py')
    assert hook_files_beyond_two([tmp_path / n for n in names]) == [
        'schedule.py', 'a_hook.py: a_args.py, a_more.py'
    ]


def hook_definitions(path: pathlib.Path) -> list:
    """``'file:line name'`` of every class in ``path`` with a base spelt
    ``...Hook`` and every ``HOOKS.register_module`` call."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b).endswith('Hook') for b in node.bases):
            found.append(f'{path.name}:{node.lineno} {node.name}')
        elif isinstance(node, ast.Call) and ast.unparse(
                node.func).endswith('HOOKS.register_module'):
            found.append(f'{path.name}:{node.lineno} register_module')
    return found


def test_publish_defines_no_hook():
    assert [d for path in PUBLISH for d in hook_definitions(path)] == []


def test_the_hook_definition_check_sees_one(tmp_path):
    fake = tmp_path / 'x.py'
    fake.write_text('@HOOKS.register_module()\n'
                    'class X(Hook):\n    pass\n\n\n'
                    'class Y(object):\n    pass\n')
    assert [d.split()[1]
            for d in hook_definitions(fake)] == ['X', 'register_module']


#: issue 47: a constructor a user can read (related options grouped)
MAX_HOOK_ARGUMENTS = 12


def hook_arguments() -> dict:
    """The number of constructor arguments of every hook mmstats
    registers, by name: those it adds to the mmengine hook it subclasses
    (a drop-in such as ``mmstats.CheckpointHook`` takes mmengine's own
    arguments as they are; only its own count)."""
    import inspect

    from mmengine.hooks import Hook

    import mmstats.hooks  # noqa: F401 (registers them)
    from mmstats.registry import HOOKS

    def names(cls) -> set:
        return set(inspect.signature(cls.__init__).parameters) - {'self'}

    counts = {}
    for name, cls in HOOKS.module_dict.items():
        base = next(b for b in cls.__mro__[1:]
                    if b.__module__.startswith('mmengine.'))
        inherited = names(base) if base is not Hook else set()
        counts[name] = len(names(cls) - inherited)
    return counts


def test_no_hook_takes_more_than_twelve_arguments():
    counts = hook_arguments()
    assert {'StatsCollectorHook', 'PreciseBNHook'} <= set(counts)
    assert {n: c for n, c in counts.items() if c > MAX_HOOK_ARGUMENTS} == {}
