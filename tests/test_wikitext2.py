"""WikiText-2 in the package (sparsecomm/bench/data/wikitext-2) and the language-model task on it
(sparsecomm/bench/tasks.py ``wikitext2``): where the text is found, its tokens and vocabulary
against counts made here from the raw files, the streams of truncated backpropagation through
time, and a short training that lowers held-out perplexity. About 15 s on 2 cores."""

from __future__ import annotations

import math
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

import sparsecomm
from sparsecomm.bench import tasks

ROOT = Path(__file__).resolve().parent.parent
FILES = ("test.txt", "valid.txt", "README.md")


def _raw_tokens(path: Path) -> list[str]:
    """The reference tokenisation, written again from its definition: every line of the file
    (split on newlines only), its words split on runs of whitespace, then one end of sentence."""
    text = path.read_bytes().decode("utf-8")
    lines = text.split("\n")
    if lines[-1] == "":      # the newline that ends the last line starts no line
        lines.pop()
    return [w for line in lines for w in (*line.split(), "<eos>")]


def test_the_text_ships_inside_the_package_not_beside_the_checkout():
    package = Path(sparsecomm.__file__).resolve().parent
    found = tasks.wikitext2_dir()
    assert found == tasks.WIKITEXT2_DIR and package in found.parents, found
    assert "shared" not in found.relative_to(package).parts
    for name in FILES:   # importlib.resources finds them as data of sparsecomm.bench, as an installed wheel would
        assert resources.files("sparsecomm.bench").joinpath("data", "wikitext-2", name).is_file(), name
    # and `pip install .` puts them in the wheel: pyproject's package data names each of them
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = package_data["sparsecomm.bench"]
    bench = package / "bench"
    shipped = {p.relative_to(bench).as_posix() for pattern in patterns for p in bench.glob(pattern)}
    assert {f"data/wikitext-2/{name}" for name in FILES} <= shipped, (patterns, shipped)


def test_the_readme_carries_attribution_licence_and_the_splits_use():
    readme = (tasks.WIKITEXT2_DIR / "README.md").read_text()
    for words in ("Merity", "Pointer Sentinel Mixture Models", "CC BY-SA 3.0", "pytorch/examples",
                  "word_language_model/data/wikitext-2", "**`test.txt` trains**", "**`valid.txt` is held out**",
                  "not shipped"):
        assert words in readme, words


@pytest.mark.parametrize("name", ["test.txt", "valid.txt"])
def test_tokens_are_the_words_of_each_line_then_eos(name):
    path = tasks.WIKITEXT2_DIR / name
    raw = _raw_tokens(path)
    assert tasks.read_words(path) == raw
    lines = path.read_text(encoding="utf-8").count("\n")
    assert raw.count("<eos>") == lines
    # the published sizes of these two splits (pytorch/examples' tokenisation)
    assert len(raw) == {"test.txt": 245_569, "valid.txt": 217_646}[name]


def test_vocabulary_is_the_training_files_words_and_unknown_words_become_unk():
    train = _raw_tokens(tasks.WIKITEXT2_DIR / tasks.WIKITEXT2_TRAIN)
    held_out = _raw_tokens(tasks.WIKITEXT2_DIR / tasks.WIKITEXT2_HELD_OUT)
    distinct = set(train)
    assert {"<unk>", "<eos>"} <= distinct and len(distinct) == 14_143
    vocab = tasks.build_vocab(tasks.read_words(tasks.WIKITEXT2_DIR / tasks.WIKITEXT2_TRAIN))
    assert set(vocab) == distinct and sorted(vocab.values()) == list(range(len(distinct)))
    assert vocab[train[0]] == 0          # ids in order of first appearance
    ids = tasks.encode(held_out, vocab)
    unknown = sum(w not in distinct for w in held_out)
    assert unknown == 10_856             # 5.0% of valid.txt's tokens are words test.txt lacks
    assert int((ids == vocab["<unk>"]).sum()) == held_out.count("<unk>") + unknown


def test_the_task_is_the_files_in_consecutive_segments():
    task = tasks.wikitext2_task(hidden=8, seq_len=35, eval_tokens=None)
    train = _raw_tokens(tasks.WIKITEXT2_DIR / tasks.WIKITEXT2_TRAIN)
    held_out = _raw_tokens(tasks.WIKITEXT2_DIR / tasks.WIKITEXT2_HELD_OUT)
    assert task.train_x.shape == ((len(train) - 1) // 35, 35) and task.test_x.shape == ((len(held_out) - 1) // 35, 35)
    # y is x shifted by one token: the text read straight through
    assert torch.equal(task.train_x.reshape(-1)[1:], task.train_y.reshape(-1)[:-1])
    assert torch.equal(task.train_x[1:, 0], task.train_y[:-1, -1])
    vocab = tasks.build_vocab(train)
    assert task.train_x[0].tolist() == [vocab[w] for w in train[:35]]
    assert task.metric is tasks.PERPLEXITY and not task.metric.higher_is_better and task.sequential
    assert not task.generated and "WikiText-2" in task.data and "CC BY-SA 3.0" in task.data


def test_the_default_model_has_ten_to_twenty_million_parameters_and_a_row_sparse_embedding_gradient():
    task = tasks.make_task("wikitext2")
    torch.manual_seed(0)
    model = task.build()
    params = sum(p.numel() for p in model.parameters())
    vocab = 14_143
    h = 400   # embedding 400, 2 LSTM layers of 400 (4 gates, two biases), softmax 400 -> vocab
    lstm = 2 * (4 * h * (h + h) + 2 * 4 * h)
    assert params == vocab * h + lstm + h * vocab + vocab == 13_894_943
    idx = tasks.stream_order(len(task.train_x), task.batch, 1)[0]
    logits, _ = model(task.train_x[idx])
    tasks.loss_of(logits, task.train_y[idx]).backward()
    rows = (model.embedding.weight.grad != 0).any(1)
    assert int(rows.sum()) == len(task.train_x[idx].unique())   # only the words in the batch


def test_streams_continue_where_they_ended():
    order = tasks.stream_order(12, 3, 9)   # 3 streams of 4 segments: rows 0-3, 4-7, 8-11
    assert [o.tolist() for o in order] == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11], [0, 4, 8],
                                           [1, 5, 9], [2, 6, 10], [3, 7, 11], [0, 4, 8]]
    assert tasks.stream_length(12, 3) == 4
    with pytest.raises(ValueError, match="cannot make 5 streams"):
        tasks.stream_order(4, 5, 1)


def test_a_few_updates_lower_held_out_perplexity():
    torch.manual_seed(0)
    task = tasks.wikitext2_task(hidden=32, seq_len=20, batch=16, eval_tokens=3000, lr=0.01)
    model = task.build()
    optimizer = task.optimizer(list(model.parameters()))

    def perplexity() -> float:
        _, loss, count = tasks.evaluation_sums(model, task.test_x, task.test_y, task.eval_batch, sequential=True)
        return math.exp(loss / count)

    before = perplexity()
    assert before > 5000   # about the vocabulary's size: a uniform guess
    state = None
    for idx in tasks.stream_order(len(task.train_x), task.batch, 30):
        optimizer.zero_grad()
        logits, state = model(task.train_x[idx], state)
        state = tasks.detach_state(state)
        tasks.loss_of(logits, task.train_y[idx]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), task.clip)
        optimizer.step()
    after = perplexity()
    assert math.isfinite(after) and after < before / 5, (before, after)


def test_a_data_dir_without_the_two_files_is_an_error_naming_them(tmp_path):
    with pytest.raises(ValueError, match=r"holds no WikiText-2 test\.txt and valid\.txt.*test\.txt \(trains\) and "
                                         r"valid\.txt \(held out\)"):
        tasks.wikitext2_dir(tmp_path)
    (tmp_path / "test.txt").write_text("a b\n")
    with pytest.raises(ValueError, match=r"holds no WikiText-2 valid\.txt:"):
        tasks.wikitext2_dir(tmp_path)
    (tmp_path / "valid.txt").write_text("b a\n")
    assert tasks.wikitext2_dir(tmp_path) == tmp_path
