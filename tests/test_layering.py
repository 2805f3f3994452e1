"""The layering of docs/architecture.md: the cores (``mmstats/stats``,
``mmstats/precise_bn``) import nothing of mmengine's Runner or of the hooks;
Runner-facing code lives under ``mmstats/hooks``."""
import ast
import pathlib
import re

import pytest

import mmstats

ROOT = pathlib.Path(mmstats.__file__).parent
CORES = sorted(
    p for core in ('stats', 'precise_bn') for p in (ROOT / core).glob('*.py'))
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
