"""The collective benchmark's bar chart (collectives_bars.png) from a written report, no ranks:
its title stays inside the figure however long the link's description, and the "speedup over
dense" panel says that dense is missing when it is, instead of an empty axis."""

from __future__ import annotations

import re

import pytest

from sparsecomm.bench import collectives
from sparsecomm.bench.plots import pyplot

# what describe_link() says of a two-level emulated cluster: the longest titles
WHERE = ("emulated cluster, 2 nodes x 2 ranks, 1gbit between nodes (0.954 Gbit/s measured node 0 -> node 1, "
         "interface eth0), inside a node plain loopback (16.8 Gbit/s measured)")


def _report(names: list[str]) -> dict:
    dense_t = 0.040 if "dense" in names else None
    rows = []
    for i, name in enumerate(names):
        t = 0.040 if name == "dense" else 0.010 * (i + 1)
        rows.append({"algorithm": name, "P": 4, "N": 200_000, "density": 0.01, "k": 2000, "baseline": False,
                     "lossless": True, "repeats": 1, "time_s": t, "comm_s": t / 2, "bytes_sent": 16_000 * (i + 1),
                     "rounds": 2, "speedup_vs_dense": dense_t / t if dense_t else None, "bound_s": t / 10,
                     "bound_over_measured": 0.1})
    return {"P": 4, "N": 200_000, "gradients": {"source": "random"}, "densities": [0.01], "repeats": 1,
            "rows": rows, "where": WHERE}


def _bars(report: dict, tmp_path, monkeypatch):
    """The bar chart's figure, as _write drew and saved it."""
    plt = pyplot()
    if plt is None:
        pytest.skip("matplotlib is not installed: no plots")
    closed, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: closed.append(fig))
    collectives._write(report, tmp_path)
    assert (tmp_path / "collectives_bars.png").stat().st_size > 0
    (fig,) = closed   # one density, one P: the bars only
    fig.canvas.draw()
    yield fig
    close(fig)


def test_the_title_stays_inside_the_figure_and_a_run_without_dense_says_so(tmp_path, monkeypatch):
    for fig in _bars(_report(["topka", "spardl", "zen"]), tmp_path, monkeypatch):
        title = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
        assert 0 <= title.x0 and title.x1 <= fig.bbox.x1 and title.y1 <= fig.bbox.y1, (title, fig.bbox)
        speedup = fig.axes[2]
        assert speedup.get_title() == "speedup over dense"
        assert [t.get_text() for t in speedup.texts] == [
            "no speedup over dense:\ndense is not in this run\n(add dense to --algorithms)"]
        assert not speedup.patches   # no empty bars


def test_with_dense_the_panel_shows_each_speedup(tmp_path, monkeypatch):
    for fig in _bars(_report(["dense", "topka", "spardl"]), tmp_path, monkeypatch):
        speedup = fig.axes[2]
        # dense 40 ms; topka 20 ms, spardl 30 ms (10 ms x their position)
        assert [round(bar.get_height(), 6) for bar in speedup.patches] == [1.0, 2.0, round(4 / 3, 6)]
        assert not speedup.texts


def _label_boxes(fig, axis):
    """(texts, window boxes left to right / bottom to top) of ``axis``' visible tick labels."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in axis.get_ticklabels(minor=False) + axis.get_ticklabels(minor=True)
              if t.get_text() and t.get_visible()]
    boxes = sorted(((t.get_window_extent(renderer), t.get_text()) for t in labels), key=lambda b: (b[0].x0, b[0].y0))
    return [text for _, text in boxes], [box for box, _ in boxes]


def _overlapping(boxes) -> bool:
    return any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))


def test_log_axis_labels_of_the_demos_panel_do_not_run_into_each_other():
    """The demo's wall-time panel (half of a 15-inch figure, 1.3 to 37 s on a log axis): matplotlib
    labels its minor ticks 2 x 10^0, 3 x 10^0, 4 x 10^0, ..., which overlap; plain numbers do not."""
    from sparsecomm.bench.plots import plain_log_ticks

    plt = pyplot()
    if plt is None:
        pytest.skip("matplotlib is not installed: no plots")
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.2))   # sparsecomm.bench.accuracy.plot's layout
    for i in range(16):   # the demo's 16 methods, their legend beside the second panel
        axes[0].plot([1.3 + i, 4.0, 12.0, 37.0 - i], [20, 60, 95, 99], label=f"method_{i:02d}_name")
        axes[1].plot([0, 40, 80], [20, 90, 99], label=f"method_{i:02d}_name")
    axes[0].set_xscale("log")
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("time to accuracy: ...", fontsize=10)
    fig.tight_layout()
    texts, boxes = _label_boxes(fig, axes[0].xaxis)
    assert _overlapping(boxes), texts   # the reference: what the demo's figure shows
    plain_log_ticks(axes[0].xaxis)
    texts, boxes = _label_boxes(fig, axes[0].xaxis)
    assert not _overlapping(boxes) and {"2", "3", "10", "20"} <= set(texts), texts
    assert all(re.fullmatch(r"[\d.]+", text) for text in texts), texts
    plt.close(fig)


def test_line_plots_label_their_log_axes_in_plain_numbers(tmp_path, monkeypatch):
    from sparsecomm.bench.plots import line_plot

    plt = pyplot()
    if plt is None:
        pytest.skip("matplotlib is not installed: no plots")
    closed, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: closed.append(fig))
    series = {"dense": [(1.3, 0.9), (37.0, 0.12)], "topka": [(1.3, 0.5), (20.0, 0.11)]}
    line_plot(plt, tmp_path / "p.png", series, "seconds", "a title", log_x=True)
    (fig,) = closed
    for axis in (fig.axes[0].xaxis, fig.axes[0].yaxis):
        texts, boxes = _label_boxes(fig, axis)
        assert len(texts) >= 3 and not _overlapping(boxes), texts
        assert all(re.fullmatch(r"[\d.]+", text) for text in texts), texts
    close(fig)
