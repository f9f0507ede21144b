"""The time-to-accuracy benchmark (sparsecomm/bench/accuracy.py, sparsecomm/bench/tasks.py):
time to target from a curve, the table, presets, the tasks' data, one small run end to end."""

from __future__ import annotations

import json
import re

import pytest
import torch

from sparsecomm import DensitySchedule
from sparsecomm.bench import accuracy as bench_accuracy
from sparsecomm.bench import tasks as bench_tasks
from sparsecomm.bench.cli import main as bench_main

CURVE = [{"updates": 0, "time_s": 0.0, "accuracy": 0.1}, {"updates": 4, "time_s": 1.5, "accuracy": 0.6},
         {"updates": 8, "time_s": 3.0, "accuracy": 0.9}, {"updates": 12, "time_s": 4.5, "accuracy": 0.85}]


@pytest.mark.parametrize("target, expected", [(0.05, (0.0, 0)), (0.6, (1.5, 4)), (0.61, (3.0, 8)),
                                              (0.9, (3.0, 8)), (0.95, (None, None))])
def test_time_to_target_is_the_first_evaluation_at_or_above_it(target, expected):
    assert bench_accuracy.time_to_target(CURVE, target) == expected


def test_table_gives_speedup_in_time_to_target_and_marks_misses():
    def method(name, t, u, updates=12):
        return {"method": name, "label": name, "time_to_target_s": t, "updates_to_target": u, "updates": updates,
                "final_accuracy": 0.9, "step_s": 0.25, "bytes": 2_000_000}
    table = bench_accuracy.format_table({"methods": [method("dense", 6.0, 8), method("topka", 1.5, 12),
                                                      method("gtopk", None, None)]})
    assert "| dense | 6.0 | 1.00x | 8 | 90.0% | 250 | 2.000 |" in table
    assert "| topka | 1.5 | 4.00x | 12 |" in table
    assert "| gtopk | not reached | - | >12 |" in table


def test_schedule_presets_are_the_papers_warmups():
    assert bench_accuracy.schedule_preset("gs", 30) == DensitySchedule.per_step([0.25, 0.0725, 0.015], every=10)
    assert bench_accuracy.schedule_preset("dgc", 40) == DensitySchedule.exponential(0.25, 40, stages=4)
    with pytest.raises(ValueError, match="unknown density schedule 'x'"):
        bench_accuracy.schedule_preset("x", 10)


def test_all_expands_to_every_registered_algorithm_and_the_hooks():
    import sparsecomm as sc
    methods = bench_accuracy.expand_methods(["all", "spardl@dgc"])
    assert methods[0] == "dense" and set(sc.algorithms.names()) <= set(methods)
    assert {"torch_fp16", "torch_powersgd", "spardl@dgc"} <= set(methods)
    for bad, message in [("nope", "nope"), ("spardl@x", "unknown density schedule"),
                         ("torch_fp16@gs", "take no density schedule")]:
        with pytest.raises(ValueError, match=message):
            bench_accuracy.check_methods([bad])


@pytest.mark.parametrize("name", ["vgg16", "resnet20", "lstm"])
def test_generated_tasks_say_so_and_spread_labels_over_the_classes(name):
    task = bench_tasks.make_task(name, generated_sizes=(1000, 100))  # the defaults' 8000 / 1000, smaller
    assert task.generated and len(task.train_y) == 1000 and len(task.test_y) == 100 and task.data.startswith("GENERATED") and "teacher" in task.data
    classes = int(task.train_y.max()) + 1
    counts = torch.bincount(task.train_y, minlength=classes)
    # centred teacher logits: no class holds more than 3x its fair share, none is empty
    assert counts.min() > 0 and counts.max() < 3 * len(task.train_y) / classes, counts.tolist()
    # the labels are the teacher's: a fresh teacher from the same seed gives them again
    torch.manual_seed(1234)
    again, _ = bench_tasks.teacher_labels(task.build(), task.train_x, task.test_x)
    assert torch.equal(again, task.train_y)


def test_digits_is_real_data():
    pytest.importorskip("sklearn")
    task = bench_tasks.make_task("digits")
    assert not task.generated and len(task.test_y) == 360 and len(task.train_y) == 1797 - 360


def test_accuracy_cli_end_to_end(tmp_path, capsys):
    pytest.importorskip("sklearn")
    rc = bench_main(["accuracy", "--task", "digits", "--nproc", "2", "--algorithms", "dense", "topka", "spardl@gs",
                     "--steps", "20", "--eval-every", "10", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "DATA: REAL: scikit-learn's digits" in out
    report = json.loads((tmp_path / "accuracy_digits_P2.json").read_text())
    by = {m["method"]: m for m in report["methods"]}
    assert list(by) == ["dense", "topka", "spardl@gs"] and report["interleaved"]
    assert report["target"] == pytest.approx(0.99 * by["dense"]["best_accuracy"])
    for m in by.values():
        assert [p["updates"] for p in m["curve"]] == [0, 10, 20]
        assert m["curve"][1]["time_s"] > 0 and m["curve"][2]["time_s"] > m["curve"][1]["time_s"]
        assert re.search(rf"^\| {re.escape(m['label'])} \| ", out, re.MULTILINE)
    # the warm-up's schedule is recorded and its first steps are denser than topka's 1%
    assert by["spardl@gs"]["density_schedule"] == "per_step(densities=[0.25, 0.0725, 0.015], every=1)"
    assert by["dense"]["bytes"] > by["topka"]["bytes"] > 0
    assert (tmp_path / "accuracy_digits_P2.png").exists() or "matplotlib is not installed" in out
