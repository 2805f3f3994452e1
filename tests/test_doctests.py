"""The ``Example:`` sections of mmstats run (doctest), and every public
function and class has one."""
import ast
import doctest
import importlib
import pathlib

import mmengine.runner  # noqa: F401  (see below)
import pytest

import mmstats
from mmstats.utils.moved import MOVED
from mmstats.utils.torch_compat import COMPILED_OPS, torch_at_least

# mmengine.runner is imported before the examples run: an installed
# DeepSpeed, which it imports, logs a line to stdout that must not fall
# into the output of the first example importing it.

ROOT = pathlib.Path(mmstats.__file__).parent
# Modules that run when imported (opt-in ``custom_imports`` targets): their
# examples are code blocks, checked by the docs build, not run here.
IMPORT_TIME = {'mmstats.launch.allow_checkpoints', 'mmstats.launch.cpu_dist'}
# The old paths of moved modules: aliases of their new module (which is
# checked under its own name), each warning when imported
IMPORT_TIME |= set(MOVED)
MODULES = sorted('.'.join(p.relative_to(ROOT.parent).with_suffix('').parts)
                 for p in ROOT.rglob('*.py')
                 if p.name != '__init__.py') + ['mmstats']

#: examples of features that need a newer torch than the oldest supported
#: (mmstats/utils/torch_compat.py): run where torch has them
NEEDS_TORCH = {
    'mmstats.stats.reporting.enable_compile_support': COMPILED_OPS,
    'mmstats.stats.reporting.report_traced': COMPILED_OPS,
    'mmstats.utils.torch_compat.fully_shard_api': '2.4',
}


@pytest.mark.parametrize('name', [m for m in MODULES if m not in IMPORT_TIME])
def test_examples_run(name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for example in doctest.DocTestFinder().find(importlib.import_module(name)):
        if torch_at_least(NEEDS_TORCH.get(example.name, '0')):
            runner.run(example)
    assert runner.failures == 0


def public_without_example(path: pathlib.Path) -> list:
    """The public module-level functions and classes of ``path`` (its
    ``__all__``, else every name without a leading underscore) whose
    docstring has no ``Example:`` section."""
    tree = ast.parse(path.read_text())
    listed = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == '__all__'
                for t in node.targets):
            listed = set(ast.literal_eval(node.value))
    return [
        f'{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}'
        for node in tree.body
        if isinstance(node, (ast.FunctionDef,
                             ast.ClassDef)) and not node.name.startswith('_')
        and (listed is None or node.name in listed) and 'Example:' not in (
            ast.get_docstring(node) or '')
    ]


def test_every_public_function_and_class_has_an_example():
    missing = [
        m for p in sorted(ROOT.rglob('*.py'))
        for m in public_without_example(p)
    ]
    assert missing == []


def test_the_example_check_sees_a_missing_one(tmp_path):
    fake = tmp_path / 'mmstats' / 'x.py'
    fake.parent.mkdir()
    fake.write_text('def f():\n    """No example."""\n\n\n'
                    'def _g():\n    """Private."""\n\n\n'
                    'class C:\n    """Example:\n        >>> C()\n"""\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path / 'mmstats'
    try:
        assert public_without_example(fake) == ['mmstats/x.py:1 f']
    finally:
        ROOT = saved


def unannotated(path: pathlib.Path) -> list:
    """Public functions and methods of public classes in ``path`` with a
    parameter or a return without a type hint."""
    found = []

    def visit(nodes: list, owner: str = '') -> None:
        for node in nodes:
            if isinstance(node,
                          ast.ClassDef) and not node.name.startswith('_'):
                visit(node.body, f'{node.name}.')
            elif isinstance(node,
                            ast.FunctionDef) and (not node.name.startswith('_')
                                                  or node.name == '__init__'):
                args = node.args
                params = [
                    a for a in args.posonlyargs + args.args + args.kwonlyargs +
                    [args.vararg, args.kwarg]
                    if a is not None and a.arg not in ('self', 'cls')
                ]
                if any(a.annotation is None
                       for a in params) or (node.returns is None
                                            and node.name != '__init__'):
                    found.append(f'{path.name}:{node.lineno} {owner}'
                                 f'{node.name}')

    visit(ast.parse(path.read_text()).body)
    return found


def test_every_public_signature_has_type_hints():
    missing = [m for p in sorted(ROOT.rglob('*.py')) for m in unannotated(p)]
    assert missing == []


def test_the_hint_check_sees_a_missing_one(tmp_path):
    fake = tmp_path / 'x.py'
    fake.write_text('def f(runner) -> None:\n    pass\n\n\n'
                    'class C:\n    def g(self, x: int):\n        pass\n')
    assert unannotated(fake) == ['x.py:1 f', 'x.py:6 C.g']
