"""Every reference in the user-facing Markdown resolves.

The README, the notes in ``docs/``, ``configs/README.md``, the demo's
README and the CHANGELOG are walked for

- relative Markdown links and images, ``[text](path#anchor)``: the file
  exists (relative to the document), and an ``#anchor`` names a heading of
  the target (GitHub's slugs, which ``myst_heading_anchors`` in
  ``docs/conf.py`` reproduces for the Sphinx site);
- repository paths cited in inline code, e.g. ``tools/train.py`` or
  ``configs/_base_/strategies/{ddp,fsdp}.py``: a token whose first
  component is one of the repository's top-level folders, or a bare file
  name ending in ``.py``, ``.md`` or ``.sh``, exists (relative to the
  repository root or to the document; a bare name anywhere in those
  folders).

Fenced code blocks are skipped (they show commands and configs of the
reader's own files). The checker itself is tested on a planted broken link
and path, so the walk cannot pass by finding nothing.
"""
import glob
import itertools
import os
import os.path as osp
import re

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DOCUMENTS = ('README.md', 'docs/*.md', 'configs/README.md',
             'projects/digits_demo/README.md', 'CHANGELOG.md')
# first components of the paths that are this repository's
TOP_LEVEL = ('mmstats', 'tools', 'docs', 'configs', 'tests', 'projects',
             'requirements', '.ci')
SUFFIXES = ('.py', '.md', '.sh')

FENCE = re.compile(r'^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$', re.M | re.S)
LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?'
                  r'(?:\s+"[^"]*")?\s*\)')
CODE = re.compile(r'(`+)(.+?)\1', re.S)
HEADING = re.compile(r'^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$', re.M)
BRACES = re.compile(r'\{([^{}]*,[^{}]*)\}')


def documents(root: str = ROOT) -> list:
    found = []
    for pattern in DOCUMENTS:
        found += sorted(glob.glob(osp.join(root, pattern)))
    return found


def strip_fences(text: str) -> str:
    """The text without fenced code blocks (line count kept)."""
    return FENCE.sub(lambda m: '\n' * m.group(0).count('\n'), text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (and myst's with heading anchors)."""
    text = re.sub(r'`([^`]*)`', r'\1', heading)
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)  # a link's text
    text = text.strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path: str) -> set:
    with open(path, encoding='utf-8') as f:
        text = strip_fences(f.read())
    seen: dict = {}
    result = set()
    for match in HEADING.finditer(text):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f'{base}-{count}')
    return result


def expand(token: str) -> list:
    """``a/{b,c}.py`` -> ``['a/b.py', 'a/c.py']``."""
    parts = BRACES.split(token)
    choices = [[p] if i % 2 == 0 else p.split(',')
               for i, p in enumerate(parts)]
    return [''.join(c) for c in itertools.product(*choices)]


def basenames(root: str) -> set:
    names = set(os.listdir(root))
    for top in TOP_LEVEL:
        for _, dirs, files in os.walk(osp.join(root, top)):
            dirs[:] = [
                d for d in dirs if not d.startswith(('.', '_build'))
                and d != '__pycache__' and not d.endswith('.egg-info')
            ]
            names.update(files)
    return names


def cited_paths(code: str) -> list:
    """The tokens of an inline code span that cite a repository path."""
    cited = []
    for token in code.split():
        token = token.strip('\'"(),;:')
        if ('://' in token or '::' in token or '$' in token or '<' in token
                or token.startswith(('-', '~', '/'))):  # placeholders too
            continue
        first = token.split('/')[0]
        if first in TOP_LEVEL and '/' in token:
            cited.append(token)
        elif '/' not in token and token.endswith(SUFFIXES) and \
                re.fullmatch(r'[\w.\-]+', token):
            cited.append(token)
    return cited


def path_exists(path: str, base: str, root: str, names: set) -> bool:
    path = path.split('#')[0]
    for candidate in expand(path):
        if any(c in candidate for c in '*?'):
            hits = glob.glob(osp.join(root, candidate)) + glob.glob(
                osp.join(base, candidate))
        else:
            hits = [
                p
                for p in (osp.join(root, candidate), osp.join(base, candidate))
                if osp.exists(p)
            ]
            if not hits and '/' not in candidate:
                hits = [candidate] if candidate in names else []
        if not hits:
            return False
    return True


def broken_references(doc: str, root: str = ROOT, names=None) -> list:
    """``'doc:line: what'`` for each reference of ``doc`` that does not
    resolve."""
    names = basenames(root) if names is None else names
    with open(doc, encoding='utf-8') as f:
        text = strip_fences(f.read())
    base = osp.dirname(doc)
    rel = osp.relpath(doc, root)
    broken = []

    def line_of(pos: int) -> int:
        return text.count('\n', 0, pos) + 1

    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r'^[a-z][a-z0-9+.\-]*:', target, re.I):
            continue  # https:, mailto:, ...
        path, _, anchor = target.partition('#')
        where = f'{rel}:{line_of(match.start())}'
        full = osp.normpath(osp.join(base, path)) if path else doc
        if not osp.exists(full):
            broken.append(f'{where}: link to {target!r}: no such file')
        elif anchor and full.endswith('.md') and \
                anchor not in anchors(full):
            broken.append(f'{where}: link to {target!r}: no heading '
                          f'with the anchor #{anchor}')
    for match in CODE.finditer(text):
        for path in cited_paths(match.group(2)):
            if not path_exists(path, base, root, names):
                broken.append(f'{rel}:{line_of(match.start())}: cites '
                              f'`{path}`, which does not exist')
    return broken


def test_the_walk_covers_the_documents():
    docs = [osp.relpath(d, ROOT) for d in documents()]
    for doc in ('README.md', 'CHANGELOG.md', 'configs/README.md',
                'projects/digits_demo/README.md', 'docs/architecture.md',
                'docs/benchmarks.md'):
        assert doc in docs
    assert len(docs) >= 20


@pytest.mark.parametrize('doc', [osp.relpath(d, ROOT) for d in documents()])
def test_every_reference_resolves(doc):
    broken = broken_references(osp.join(ROOT, doc))
    assert not broken, '\n'.join(broken)


def test_the_checker_finds_planted_broken_references(tmp_path):
    """A broken link, anchor and cited path are each reported (with their
    line); good ones, fenced code and URLs are not."""
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'tools').mkdir()
    (tmp_path / 'tools' / 'train.py').write_text('')
    (tmp_path / 'docs' / 'other.md').write_text('# A heading: `x`\n')
    doc = tmp_path / 'docs' / 'note.md'
    doc.write_text('\n'.join([
        '# Note',
        'Good: [other](other.md#a-heading-x), [self](#note), '
        '[web](https://example.com/x.md), `tools/train.py CFG`,',
        '`tools/{train,train}.py`, `train.py`, `other.md`, `a.b`,',
        '`projects/<name>/`, `mmpretrain::resnet/r50.py`.',
        '```bash',
        'python tools/missing.py  # fenced: not checked',
        '```',
        'Bad: [gone](gone.md)',
        '[anchor](other.md#no-such-heading)',
        '`tools/analysis_tools/` and `_dist.py`',
        '![img](../tools/missing.png)',
    ]))
    broken = broken_references(str(doc), root=str(tmp_path))
    assert broken == [
        "docs/note.md:8: link to 'gone.md': no such file",
        "docs/note.md:9: link to 'other.md#no-such-heading': no heading "
        'with the anchor #no-such-heading',
        "docs/note.md:11: link to '../tools/missing.png': no such file",
        'docs/note.md:10: cites `tools/analysis_tools/`, which does not '
        'exist',
        'docs/note.md:10: cites `_dist.py`, which does not exist',
    ], broken


def test_slugs_are_githubs():
    assert slug('The reduction inside the graph (issue 27)') == \
        'the-reduction-inside-the-graph-issue-27'
    assert slug('How `report()` works, where you may call it') == \
        'how-report-works-where-you-may-call-it'
    assert slug('1. Spikes') == '1-spikes'
    assert expand('a/{b,c}.py') == ['a/b.py', 'a/c.py']
