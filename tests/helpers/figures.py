"""Read what a plot tool of ``tools/analysis`` drew: the figure's title,
its colour bars' labels and the values each bar stands for; and
:func:`assert_readable`, what every tool's test asserts of its figures."""
import os.path as osp
import sys
from typing import List


def colorbars(fig) -> list:
    """The matplotlib Colorbars drawn on ``fig``."""
    return [ax._colorbar for ax in fig.axes if hasattr(ax, '_colorbar')]


def colorbar_labels(fig) -> List[str]:
    """The label of each colour bar of ``fig`` (its long axis)."""
    return [
        bar.ax.get_ylabel()
        if bar.orientation == 'vertical' else bar.ax.get_xlabel()
        for bar in colorbars(fig)
    ]


def suptitle(fig) -> str:
    """The figure's own title ('' without one)."""
    return fig._suptitle.get_text() if fig._suptitle is not None else ''


def wrote(out: str) -> List[str]:
    """The paths of the ``wrote PATH`` lines of a tool's stdout."""
    return [
        line[len('wrote '):] for line in out.splitlines()
        if line.startswith('wrote ')
    ]


def panels(fig) -> list:
    """The axes of ``fig`` but its colour bars'."""
    return [ax for ax in fig.axes if not hasattr(ax, '_colorbar')]


def assert_readable(fig) -> None:
    """Assert that ``fig`` reads at a glance: ``tools/analysis/figures.py``
    ``layout_problems`` finds nothing (no two texts overlap, none cut by
    the edge), the figure is at most 2.5 times as tall as wide and every
    panel has a y-axis label. First asserts that the texts the check
    measured include the figure's title, every panel's title and y label
    and every colour bar's label, so that it cannot pass by measuring
    nothing."""
    sys.path.insert(
        0,
        osp.join(
            osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
            'tools', 'analysis'))
    from figures import drawn_texts, layout_problems
    measured = {text for text, _, _ in drawn_texts(fig)}
    wanted = [suptitle(fig)] + colorbar_labels(fig) + [
        text for ax in panels(fig)
        for text in (ax.get_title(), ax.get_ylabel()) if text
    ]
    unmeasured = [text for text in wanted if text not in measured]
    assert suptitle(fig) and not unmeasured, unmeasured
    problems = layout_problems(fig)
    assert not problems, '\n'.join(problems)
    width, height = fig.get_size_inches()
    assert height <= 2.5 * width, (width, height)
    unlabelled = [ax.get_title() for ax in panels(fig) if not ax.get_ylabel()]
    assert not unlabelled, unlabelled
