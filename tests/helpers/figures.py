"""Read what a plot tool of ``tools/analysis`` drew: the figure's title,
its colour bars' labels and the values each bar stands for."""
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
