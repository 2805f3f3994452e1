"""docs/architecture.md matches the code (issue 54): its layer table is
``tests/test_layering.py``'s ``LAYERS``, its registry table the registries
of ``mmstats/registry.py`` (names, parents, what they hold), and every
object its patch table names exists. A drift of either side fails here."""
import importlib
import pathlib
import re

import pytest
from mmengine.registry import Registry

import mmstats.registry
from tests.test_layering import LAYERS

DOC = pathlib.Path(__file__).resolve().parents[1] / 'docs' / 'architecture.md'


def table(heading: str) -> list:
    """The rows (lists of cells, backticks off) of the first Markdown table
    after the line that starts with ``heading``."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(heading))
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith('|'):
            if rows:
                break
            continue
        cells = [
            c.strip().replace('`', '') for c in line.strip('|').split('|')
        ]
        if not set(''.join(cells)) <= set('-: '):
            rows.append(cells)
    return rows[1:]  # the header off


def own_registries() -> dict:
    """mmstats' registries by name (not the parents it imports)."""
    return {
        name: value
        for name, value in vars(mmstats.registry).items()
        if isinstance(value, Registry) and value.scope == 'mmstats'
    }


def test_the_layer_table_is_test_layerings():
    rows = table('Layers, lowest first')
    documented = [
        tuple(u.strip() for u in units.split(',')) for _, units in rows
    ]
    assert documented == [tuple(units) for units in LAYERS]
    assert [int(layer) for layer, _ in rows] == list(range(len(LAYERS)))


def test_the_registry_table_is_mmstats_registries():
    registries = own_registries()
    rows = table('Registries (')
    assert sorted(row[0] for row in rows) == sorted(registries)
    for name, parent, holds in rows:
        registry = registries[name]
        registry.import_from_location()  # what a config's type does
        assert registry.parent is importlib.import_module(
            'mmengine.registry').__dict__[parent.rpartition('.')[2]], name
        listed = {h.strip().rpartition('.')[2] for h in holds.split(',')}
        assert listed == set(registry.module_dict), (name, listed)


def test_the_text_says_as_many_registries_as_there_are():
    words = {2: 'two', 3: 'three', 4: 'four'}
    count = len(own_registries())
    text = DOC.read_text()
    for number in re.findall(r'\b(two|three|four) (?:child )?registries',
                             text):
        assert number == words[count], number


def test_every_patch_names_objects_that_exist():
    rows = table('Patches of mmengine')
    assert rows
    for row in rows:
        module = row[1].split(' ')[0]
        target = module
        while target:  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(target)
                break
            except ImportError:
                target = target.rpartition('.')[0]
        for attr in module[len(target) + 1:].split('.') if module != target \
                else ():
            obj = getattr(obj, attr)
        assert obj is not None, row


def covered_modules(package: str) -> set:
    """The modules of ``mmstats.<package>`` whose names the test files of
    ``tests/test_<package>/`` import (a name imported from the package
    counts for the module that defines it)."""
    import ast
    tests = DOC.parents[1] / 'tests' / f'test_{package}'
    covered = set()
    for path in tests.glob('test_*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (
                    node.module or '').startswith(f'mmstats.{package}'):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                obj = getattr(module, alias.name, None)
                if obj is None:  # a submodule not imported by its package
                    obj = importlib.import_module(
                        f'{node.module}.{alias.name}')
                defined = getattr(obj, '__module__', None) or getattr(
                    obj, '__name__', '')
                covered.add(defined)
            covered.add(node.module)
    return covered


@pytest.mark.parametrize('package', ['publish', 'strategies', 'launch'])
def test_the_tests_of_a_package_cover_each_of_its_modules(package):
    root = DOC.parents[1] / 'mmstats' / package
    modules = {
        f'mmstats.{package}.{p.stem}'
        for p in root.glob('*.py') if p.stem != '__init__'
    }
    assert modules - covered_modules(package) == set()
