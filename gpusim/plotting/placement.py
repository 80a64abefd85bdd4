"""Labels beside scatter points that stay inside their axes and off each other.

Each label tries a few spots around its point (right and above first) and takes the first
that lies inside the axes and covers neither a label already placed nor a marker; where none
does, the spot inside the axes that covers least. Placing needs the final size of the axes, so
the figure's layout is settled first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

Spot = tuple[tuple[float, float], Literal["left", "center", "right"], Literal["bottom", "top"]]
# (x, y) offset in points, horizontal and vertical alignment: right-above first, as a reader
# expects, then the other corners, then straight above and below.
SPOTS: tuple[Spot, ...] = (
    ((4, 4), "left", "bottom"), ((4, -4), "left", "top"), ((-4, 4), "right", "bottom"),
    ((-4, -4), "right", "top"), ((0, 6), "center", "bottom"), ((0, -6), "center", "top"),
)
MARKER_PX = 5.0  # half the side of the box a marker is taken to cover, in pixels


def _overlap(box: Bbox, others: list[Bbox]) -> float:
    """The area of ``box`` that ``others`` cover (summed; overlaps count twice)."""
    area = 0.0
    for other in others:
        width = min(box.x1, other.x1) - max(box.x0, other.x0)
        height = min(box.y1, other.y1) - max(box.y0, other.y0)
        if width > 0 and height > 0:
            area += width * height
    return area


def _inside(box: Bbox, frame: Bbox) -> bool:
    return bool(frame.x0 <= box.x0 and box.x1 <= frame.x1
                and frame.y0 <= box.y0 and box.y1 <= frame.y1)


def settle(ax: Axes) -> None:
    """Lay out the figure of ``ax``, so that the axes, and the text measured after, have
    their final size and place."""
    fig = ax.get_figure(root=True)
    assert isinstance(fig, Figure)
    fig.draw_without_rendering()


def fit_bar_labels(ax: Axes, labels: Sequence[Annotation]) -> None:
    """Move each value label of a horizontal bar that would pass the right edge of ``ax``
    inside the end of its bar, in white."""
    settle(ax)
    right = ax.get_window_extent().x1
    for label in labels:
        if label.get_window_extent().x1 > right:
            label.xyann = (-3, 0)
            label.set_horizontalalignment("right")
            label.set_color("white")


def place_labels(ax: Axes, points: Sequence[tuple[float, float]], texts: Sequence[str],
                 colors: Sequence[Any], fontsize: float = 7) -> list[Annotation]:
    """Annotate each of ``points`` (data coordinates) with its text and colour, each label
    inside ``ax`` and clear of the others and of the markers where there is room."""
    settle(ax)
    frame = ax.get_window_extent()
    to_pixels = ax.transData.transform
    taken = [Bbox.from_bounds(x - MARKER_PX, y - MARKER_PX, 2 * MARKER_PX, 2 * MARKER_PX)
             for x, y in (to_pixels(p) for p in points)]
    labels = []
    for n, (point, text, color) in enumerate(zip(points, texts, colors, strict=True)):
        label = ax.annotate(text, point, xytext=SPOTS[0][0], textcoords="offset points",
                            fontsize=fontsize, color=color)
        others = taken[:n] + taken[n + 1:]  # every marker but its own, and labels placed
        best: tuple[float, int] | None = None
        for i, (offset, ha, va) in enumerate(SPOTS):
            label.xyann = offset
            label.set_horizontalalignment(ha)
            label.set_verticalalignment(va)
            box = label.get_window_extent()
            score = _overlap(box, others) + (0.0 if _inside(box, frame) else 1e12)
            if best is None or score < best[0]:
                best = (score, i)
            if score == 0.0:
                break
        assert best is not None
        offset, ha, va = SPOTS[best[1]]
        label.xyann = offset
        label.set_horizontalalignment(ha)
        label.set_verticalalignment(va)
        taken.append(label.get_window_extent())
        labels.append(label)
    return labels
