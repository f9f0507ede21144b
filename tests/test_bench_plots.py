"""The collective benchmark's bar chart (collectives_bars.png) from a written report, no ranks:
its title stays inside the figure however long the link's description, and the "speedup over
dense" panel says that dense is missing when it is, instead of an empty axis."""

from __future__ import annotations

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
