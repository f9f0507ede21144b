"""The time-to-accuracy benchmark (sparsecomm/bench/accuracy.py, sparsecomm/bench/tasks.py):
time to target from a curve, the table, presets, the tasks' data, one small run end to end."""

from __future__ import annotations

import json
import math
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
    # Accordion's rule between the density and 10x it, decided every half warm-up, eta 0.5
    assert bench_accuracy.schedule_preset("acc", 40, 0.01) == DensitySchedule.adaptive(0.01, 0.1, 20, eta=0.5)
    assert bench_accuracy.schedule_preset("acc", 40, 0.2) == DensitySchedule.adaptive(0.2, 1.0, 20, eta=0.5)
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


# -- a metric where lower is better: the language model's perplexity ----------------------------
PPL_CURVE = [{"updates": 0, "time_s": 0.0, "perplexity": 14000.0}, {"updates": 4, "time_s": 1.5, "perplexity": 300.0},
             {"updates": 8, "time_s": 3.0, "perplexity": 200.0}, {"updates": 12, "time_s": 4.5, "perplexity": 210.0}]


def test_tasks_declare_their_metric_and_which_way_is_better():
    for name in bench_tasks.TASKS:
        assert bench_tasks.metric_of(name) is (bench_tasks.PERPLEXITY if name in ("wikitext2", "wikitext2_sgd")
                                               else bench_tasks.ACCURACY)
    assert bench_tasks.ACCURACY.higher_is_better and not bench_tasks.PERPLEXITY.higher_is_better
    assert bench_tasks.PERPLEXITY.of(0.3, 2.0) == pytest.approx(7.38905609893065)   # e^2
    assert bench_tasks.ACCURACY.of(0.3, 2.0) == 0.3


@pytest.mark.parametrize("margin, target, expected", [(0.02, 204.0, (3.0, 8)), (0.5, 300.0, (1.5, 4)),
                                                      (0.0, 200.0, (3.0, 8))])
def test_perplexity_target_is_within_a_margin_of_dense_best_and_reached_at_or_below_it(margin, target, expected):
    best = bench_tasks.PERPLEXITY.best([p["perplexity"] for p in PPL_CURVE])
    assert best == 200.0                                  # the lowest, not the highest
    assert bench_tasks.PERPLEXITY.target(best, 0.99, margin) == pytest.approx(target)
    assert bench_accuracy.time_to_target(PPL_CURVE, target, bench_tasks.PERPLEXITY) == expected
    assert bench_accuracy.time_to_target(PPL_CURVE, 199.0, bench_tasks.PERPLEXITY) == (None, None)
    # accuracy keeps its rule: a fraction of the best, reached at or above it
    assert bench_tasks.ACCURACY.target(0.9, 0.99, margin) == pytest.approx(0.891)


def test_table_names_the_metric():
    method = {"method": "dense", "label": "dense", "time_to_target_s": 3.0, "updates_to_target": 8, "updates": 12,
              "final_accuracy": 0.21, "final_perplexity": 210.04, "step_s": 0.25, "bytes": 2_000_000}
    table = bench_accuracy.format_table({"metric": "perplexity", "methods": [method]})
    assert "| final perplexity |" in table and "| dense | 3.0 | 1.00x | 8 | 210.0 | 250 | 2.000 |" in table
    assert "| final accuracy |" in bench_accuracy.format_table({"methods": [method]})


def _config(*argv):
    import argparse

    ap = argparse.ArgumentParser()
    bench_accuracy.add_arguments(ap)
    return bench_accuracy.config(ap.parse_args(list(argv)), ap)


def test_cli_checks_the_target_against_the_tasks_metric(tmp_path, capsys):
    assert _config("--task", "wikitext2", "--target", "150")["target"] == 150.0          # a perplexity
    assert _config("--task", "wikitext2", "--target-margin", "0.05")["target_margin"] == 0.05
    assert _config("--task", "digits")["target_margin"] == 0.02 and _config()["target_fraction"] == 0.99
    for argv, message in [(["--task", "wikitext2", "--target", "0"], "must be > 0"),
                          (["--task", "digits", "--target", "150"], "must be in (0, 1]"),
                          (["--task", "wikitext2", "--target-margin", "-0.1"], "--target-margin must be >= 0"),
                          (["--task", "wikitext2", "--data-dir", str(tmp_path)], "holds no WikiText-2 test.txt")]:
        with pytest.raises(SystemExit):
            _config(*argv)
        assert message in capsys.readouterr().err, argv


def _tiny_corpus(folder, words: int = 3000, vocab: int = 40, seed: int = 0) -> None:
    """A small corpus in WikiText-2's layout: word w is followed by w + 1 or w + 2 (a rule an LSTM
    picks up in a few updates), lines of 20 words."""
    gen = torch.Generator().manual_seed(seed)
    for name in ("test.txt", "valid.txt"):
        w, line, out = 0, [], []
        for _ in range(words):
            w = (w + 1 + int(torch.randint(0, 2, (1,), generator=gen))) % vocab
            line.append(f"w{w}")
            if len(line) == 20:
                out.append(" " + " ".join(line) + " \n")
                line = []
        (folder / name).write_text("".join(out))


def test_accuracy_cli_on_a_language_model_reports_perplexity(tmp_path, capsys):
    _tiny_corpus(tmp_path)
    out = tmp_path / "out"
    rc = bench_main(["accuracy", "--task", "wikitext2", "--data-dir", str(tmp_path), "--hidden", "16", "--nproc", "2",
                     "--algorithms", "dense", "topka", "--steps", "8", "--eval-every", "4", "--out", str(out),
                     "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"DATA: REAL: WikiText-2 (Merity et al. 2016, CC BY-SA 3.0) from {tmp_path}" in printed
    assert "| final perplexity |" in printed and "held-out perplexity (within 2% of dense's best" in printed
    report = json.loads((out / "accuracy_wikitext2_P2.json").read_text())
    assert report["metric"] == "perplexity" and report["higher_is_better"] is False
    by = {m["method"]: m for m in report["methods"]}
    for m in by.values():
        assert [p["updates"] for p in m["curve"]] == [0, 4, 8]
        for p in m["curve"]:
            assert p["perplexity"] == pytest.approx(math.exp(p["test_loss"]))
        assert m["best_perplexity"] == min(p["perplexity"] for p in m["curve"])
        assert m["final_perplexity"] == m["curve"][-1]["perplexity"]
        assert (m["time_to_target_s"], m["updates_to_target"]) == bench_accuracy.time_to_target(
            m["curve"], report["target"], bench_tasks.PERPLEXITY)
    assert report["target"] == pytest.approx(1.02 * by["dense"]["best_perplexity"])
    assert by["dense"]["final_perplexity"] < by["dense"]["curve"][0]["perplexity"]   # it learns (Adam, 8 updates)
    assert by["dense"]["curve"][0] == by["topka"]["curve"][0]   # the same start
    assert by["dense"]["bytes"] > by["topka"]["bytes"] > 0


# -- digits_cnn: a small ResNet on the digits task's own split -----------------------------------
def test_digits_cnn_is_the_digits_split_as_images_and_a_residual_net():
    pytest.importorskip("sklearn")
    mlp, cnn = bench_tasks.make_task("digits"), bench_tasks.make_task("digits_cnn")
    assert not cnn.generated and cnn.metric is bench_tasks.ACCURACY and cnn.train_x.shape[1:] == (1, 8, 8)
    for a, b in ((mlp.train_x, cnn.train_x), (mlp.test_x, cnn.test_x)):
        assert torch.equal(a, b.reshape(len(b), 64))
    assert torch.equal(mlp.train_y, cnn.train_y) and torch.equal(mlp.test_y, cnn.test_y)
    torch.manual_seed(0)
    model = cnn.build()
    blocks = [m for m in model.modules() if type(m).__name__ == "_BasicBlock"]
    assert len(blocks) == 3 and model.conv.in_channels == 1
    assert sum(p.numel() for p in model.parameters()) == 75_002
    optimizer = cnn.optimizer(list(model.parameters()))
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        idx = torch.randint(0, len(cnn.train_x), (cnn.batch,), generator=gen)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(cnn.train_x[idx]), cnn.train_y[idx]).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(cnn.test_x).argmax(1) == cnn.test_y).float().mean().item()
    assert accuracy > 0.85, accuracy


# -- momentum correction as a method modifier: NAME+mc, NAME+mcm, NAME+clip=X --------------------
@pytest.mark.parametrize("text, expected", [
    ("topka", ("topka", "", "", None)),
    ("topka+mc", ("topka", "", "mc", None)),
    ("spardl+mcm", ("spardl", "", "mcm", None)),
    ("topka@dgc+mc", ("topka", "dgc", "mc", None)),
    ("topka+mc@dgc", ("topka", "dgc", "mc", None)),        # any order after the name
    ("gtopk@gs+mcm+clip=0.5", ("gtopk", "gs", "mcm", 0.5)),
    ("zen+clip=2", ("zen", "", "", 2.0)),
    ("dense+mc", ("dense", "", "mc", None)),
])
def test_method_modifiers_parse_and_compose_with_the_warmup(text, expected):
    spec = bench_accuracy.parse_method(text)
    assert (spec.name, spec.schedule, spec.correction, spec.clip) == expected and spec.text == text
    assert bench_accuracy.check_methods([text]) == [spec]


@pytest.mark.parametrize("bad, message", [
    ("topka+foo", "unknown modifier '+foo'; choose from +mc, +mcm, +clip=X"),
    ("topka+mc+mcm", "momentum correction given twice"),
    ("topka+clip=0", "needs a finite norm X > 0"),
    ("topka+clip=x", "needs a finite norm X > 0"),
    ("topka@", "'@' without a density schedule"),
    ("topka@gs@dgc", "two density schedules"),
    ("+mc", "no algorithm before '+'"),
    ("topka@x+mc", "unknown density schedule 'x'"),
    ("nope+mc", "nope"),
    ("torch_fp16+mc", "PyTorch's hooks take no momentum correction"),
    ("torch_powersgd+clip=1", "PyTorch's hooks take no momentum correction, local clipping"),
    ("torch_fp16+policy", "residual form or policy"),
    ("topka+res=fp8", "keeps the residual in bf16 or int8, not 'fp8'"),
    ("topka+res=bf16+res=int8", "+res given twice"),
    ("topka+policy+policy", "+policy given twice"),
])
def test_bad_method_modifiers_are_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        bench_accuracy.check_methods([bad])


def test_momentum_correction_takes_the_momentum_and_weight_decay_out_of_sgd():
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b], "weight_decay": 0.0}], lr=0.1, momentum=0.9,
                          weight_decay=5e-4, nesterov=True)
    momentum, nesterov, decays = bench_accuracy.move_momentum(opt)
    assert (momentum, nesterov) == (0.9, True) and len(decays) == 1 and decays[0][0][0] is a
    assert decays[0][1] == 5e-4
    for group in opt.param_groups:
        assert group["momentum"] == 0 and group["weight_decay"] == 0 and not group["nesterov"]
    for optimizer, message in [(torch.optim.Adam([a], lr=1e-3), "trains with Adam which has no SGD momentum"),
                               (torch.optim.SGD([a], lr=0.1), "trains with SGD without momentum"),
                               (torch.optim.SGD([a], lr=0.1, momentum=0.9, dampening=0.1), "no dampening"),
                               (torch.optim.SGD([{"params": [a]}, {"params": [b], "momentum": 0.5}], lr=0.1,
                                                momentum=0.9), "different momenta")]:
        with pytest.raises(ValueError, match=message):
            bench_accuracy.move_momentum(optimizer)


def test_cli_refuses_momentum_correction_where_the_task_has_no_momentum(tmp_path, capsys):
    _tiny_corpus(tmp_path)
    with pytest.raises(SystemExit):
        _config("--task", "wikitext2", "--data-dir", str(tmp_path), "--algorithms", "dense", "topka@dgc+mc")
    err = capsys.readouterr().err
    assert "'topka@dgc+mc': momentum correction (+mc, +mcm) moves the optimizer's momentum into the hook" in err
    assert "wikitext2 trains with Adam" in err and "wikitext2_sgd instead of wikitext2" in err
    cfg = _config("--task", "wikitext2_sgd", "--data-dir", str(tmp_path), "--algorithms", "dense", "topka+mc")
    assert cfg["methods"] == ["dense", "topka+mc"]
    assert _config("--task", "digits_cnn", "--algorithms", "dense", "dense+mc", "topka+mcm", "--lr", "0.1")["lr"] == 0.1
    for argv, message in [(["--algorithms", "dense", "torch_fp16+mc"], "PyTorch's hooks take no momentum"),
                          (["--lr", "0"], "--lr must be > 0")]:
        with pytest.raises(SystemExit):
            _config("--task", "digits_cnn", *argv)
        assert message in capsys.readouterr().err, argv


def test_wikitext2_sgd_is_the_language_model_with_momentum_sgd(tmp_path):
    _tiny_corpus(tmp_path)
    adam = bench_tasks.make_task("wikitext2", str(tmp_path), hidden=8)
    sgd = bench_tasks.make_task("wikitext2_sgd", str(tmp_path), hidden=8)
    assert sgd.name == "wikitext2_sgd" and sgd.metric is bench_tasks.PERPLEXITY and sgd.clip == adam.clip == 0.25
    assert torch.equal(sgd.train_x, adam.train_x) and torch.equal(sgd.test_y, adam.test_y)
    opt = sgd.optimizer([torch.nn.Parameter(torch.zeros(1))])
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["momentum"] == 0.9
    assert opt.param_groups[0]["lr"] == 2.0
    assert isinstance(adam.optimizer([torch.nn.Parameter(torch.zeros(1))]), torch.optim.Adam)


def _build_options(rank, world, data_dir):
    """What _build makes of each method: (optimizer momentum, weight decay, the hook's local
    update, the clip after the reduction)."""
    out = {}
    cnn = bench_tasks.make_task("digits_cnn")
    lm = bench_tasks.make_task("wikitext2_sgd", data_dir, hidden=8)
    for task, method in [(cnn, "topka"), (cnn, "topka+mc"), (cnn, "spardl@dgc+mcm"), (cnn, "zen+clip=3"),
                         (lm, "topka"), (lm, "topka+mc"), (lm, "topka+mc+clip=1")]:
        ddp, state, opt, clip = bench_accuracy._build(method, task, 0.01, 10)
        group = opt.param_groups[0]
        out[(task.name, method)] = (group["momentum"], group["weight_decay"], state.local_update.options(), clip)
        state.close()
    return out


def test_build_moves_the_tasks_momentum_into_the_hook_state(tmp_path):
    pytest.importorskip("sklearn")
    from sparsecomm.testing import spawn

    _tiny_corpus(tmp_path)
    got = spawn(_build_options, 2, str(tmp_path), timeout=120)[0]
    assert got[("digits_cnn", "topka")] == (0.9, 5e-4, {}, None)
    assert got[("digits_cnn", "topka+mc")] == (0.0, 0.0, {"momentum": 0.9}, None)
    assert got[("digits_cnn", "spardl@dgc+mcm")] == (0.0, 0.0, {"momentum": 0.9, "momentum_masking": True}, None)
    # a norm c on the average is clip_norm = c P on the sum (2 ranks): each rank clips to c sqrt(P)
    assert got[("digits_cnn", "zen+clip=3")] == (0.9, 5e-4, {"clip_norm": 6.0}, None)
    # the language model clips: after the reduction without +mc, on each rank (DGC's local clipping) with it
    assert got[("wikitext2_sgd", "topka")] == (0.9, 0.0, {}, 0.25)
    assert got[("wikitext2_sgd", "topka+mc")] == (0.0, 0.0, {"momentum": 0.9, "clip_norm": 0.5}, None)
    assert got[("wikitext2_sgd", "topka+mc+clip=1")] == (0.0, 0.0, {"momentum": 0.9, "clip_norm": 2.0}, None)


def _trained_against_reference(rank, world, steps):
    """Parameters after ``steps`` updates of each method on 2 ranks (float64, digits_cnn), and
    of a reference written here: one model, the gradient averaged over both ranks' batches, plus
    weight decay, momentum SGD by hand."""
    torch.set_default_dtype(torch.float64)
    task = bench_tasks.make_task("digits_cnn")
    x, y = task.train_x.double(), task.train_y
    batches = [[torch.randint(0, len(x), (16,), generator=torch.Generator().manual_seed(100 * r + s))
                for s in range(steps)] for r in range(world)]
    lr, m, wd = 0.05, 0.9, 5e-4      # the task's SGD
    # numpy: a tensor would go back to the parent as shared memory, which the rank's exit may close first
    flat = lambda model: torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()  # noqa: E731

    def reference(momentum):
        torch.manual_seed(0)
        model = task.build()
        velocity = [torch.zeros_like(p) for p in model.parameters()]
        for s in range(steps):
            grads = []
            for r in range(world):
                model.zero_grad()
                bench_tasks.loss_of(model(x[batches[r][s]]), y[batches[r][s]]).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
            with torch.no_grad():
                for i, p in enumerate(model.parameters()):
                    g = sum(gr[i] for gr in grads) / world + wd * p
                    velocity[i] = momentum * velocity[i] + g
                    p -= lr * velocity[i]
        return flat(model)

    out = {"momentum SGD": reference(m), "SGD": reference(0.0)}
    for method in ("dense", "dense+mc", "topka+mc", "topka+mcm"):
        torch.manual_seed(0)
        ddp, state, opt, _ = bench_accuracy._build(method, task, 1.0, 10)   # density 1: every coordinate sent
        for s in range(steps):
            opt.zero_grad()
            bench_tasks.loss_of(ddp(x[batches[rank][s]]), y[batches[rank][s]]).backward()
            opt.step()
        out[method] = flat(ddp.module)
        state.close()
    return out


def test_momentum_correction_at_density_1_trains_as_momentum_sgd():
    """dense+mc is dense (the sanity check of the modifier): both, and topka+mc at density 1, take
    the reference's momentum SGD steps (weight decay included, which +mc moves into each rank's
    gradient); with masking every velocity is cleared each step: plain SGD."""
    pytest.importorskip("sklearn")
    from sparsecomm.testing import spawn

    got = {k: torch.from_numpy(v) for k, v in spawn(_trained_against_reference, 2, 6, timeout=180)[0].items()}
    assert (got["momentum SGD"] - got["SGD"]).abs().max() > 1e-3      # the two references differ
    for method in ("dense", "dense+mc", "topka+mc"):
        assert torch.allclose(got[method], got["momentum SGD"], rtol=0, atol=1e-10), method
    assert torch.allclose(got["topka+mcm"], got["SGD"], rtol=0, atol=1e-10)


@pytest.mark.parametrize("task", ["vgg16", "lstm"])
def test_a_data_dir_without_the_data_set_is_an_error_not_generated_data(tmp_path, task):
    from sparsecomm.bench.tasks import make_task

    with pytest.raises(ValueError, match="holds no (CIFAR|IMDB) data set"):
        make_task(task, data_dir=str(tmp_path))
