"""The views' base (``ui/view_base.py``) and its redraw (``ui/redraw.py``), with a fake model."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from interactive_shard.ui.redraw import Redrawn, spec_of
from interactive_shard.ui.view_base import LATEST, PanelView


class _Model:
    def __init__(self) -> None:
        self.revision = 0
        self.ranks: list[int] = []
        self.iterations = 0

    def update(self) -> bool:
        return False

    def arrive(self, ranks: list[int], iterations: int) -> None:
        self.ranks, self.iterations = ranks, iterations
        self.revision += 1


class _View(PanelView[_Model]):
    def __init__(self, model: _Model, *, rank: int | None = None, iteration: int = LATEST) -> None:
        super().__init__(model, rank, iteration)
        self.drawn: list[tuple[int, int]] = []

    def _newest(self) -> int | None:
        return self.model.iterations or None

    def _iteration_note(self) -> str:
        return f"0 = latest ({self.model.iterations})"

    def _panels(self) -> list[Any]:
        self.figure = self._figure("figure")
        self._observe(self._rank_selector(), self._iteration_box("200px")[0])
        return [self.rank_selector, self.iteration_selector, self.iteration_note, self.figure]

    def _redraw(self) -> None:
        it = self.chosen_iteration or self.model.iterations
        if self._changed("figure", (self.model.revision, self.rank, it)):
            self.drawn.append((self.rank, it))
            self._draw("figure", ([{"type": "bar", "y": [it]}], {"title": {"text": f"{it}"}}))


def test_selectors_follow_the_run_and_a_user_s_move_redraws() -> None:
    model = _Model()
    view = _View(model)
    view.widget  # noqa: B018
    assert (view.rank, view.iteration_selector.max, view.drawn) == (0, 0, [(0, 0)])
    model.arrive([1, 2], 5)  # rank 0 has not reported yet: the lowest is shown
    view.refresh()
    assert view.rank == 1 and view.rank_selector.options == (("1", 1), ("2", 2))
    assert (view.iteration_selector.value, view.iteration_selector.max) == (LATEST, 5)
    assert view.iteration_note.value == "0 = latest (5)" and view.drawn[-1] == (1, 5)
    view.refresh()
    assert len(view.drawn) == 2  # nothing new: nothing redrawn
    view.iteration_selector.value = 3
    assert view.chosen_iteration == 3 and view.drawn[-1] == (1, 3)
    assert view.figure.layout.title.text == "3"
    view.rank_selector.value = 2
    assert view.chosen_rank == 2 and view.drawn[-1] == (2, 3)


def test_state_given_first_and_the_view_s_own_moves_are_quiet() -> None:
    model = _Model()
    model.arrive([0, 1], 4)
    view = _View(model, rank=1, iteration=2)
    view.widget  # noqa: B018
    assert (view.rank_selector.value, view.iteration_selector.value) == (1, 2)
    view.chosen_iteration = LATEST
    view.refresh()  # moves the box to LATEST without reading it back as the user's choice
    assert view.iteration_selector.value == LATEST and view.chosen_iteration == LATEST
    assert view.drawn == [(1, 2), (1, 4)]


def test_a_patch_that_adds_or_removes_shapes_keeps_the_figure_s_objects() -> None:
    # plotly keeps an object per shape, which a relayout of the list alone leaves as it was.
    redrawn = Redrawn(go.FigureWidget())
    line = {"type": "line", "x0": 1, "x1": 1, "y0": 0, "y1": 1}
    shapes = [[line], [line, {**line, "x0": 2, "x1": 2}], []]
    assert redrawn.draw(spec_of(go.Figure(go.Bar(y=[1]), layout={"shapes": shapes[0]})))
    for drawn in shapes[1:]:
        assert not redrawn.draw(spec_of(go.Figure(go.Bar(y=[2]), layout={"shapes": drawn})))
        assert [s.x0 for s in redrawn.widget.layout.shapes] == [s["x0"] for s in drawn]
    assert list(redrawn.widget.data[0].y) == [2] and redrawn.whole == 1
