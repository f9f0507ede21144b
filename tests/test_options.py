"""Every option of every algorithm (and of the reducer and the DDP hook state) is checked when
it is given: NaN, Inf, negative, zero, out of range or of the wrong type raise one ValueError
naming the option, the value and what to give instead -- never a late failure at the first
reduction. Options that depend on the number of ranks (spardl's ``teams``) are checked as soon
as that number is known, before any message.
"""

from __future__ import annotations

import math
import re

import pytest

from sparsecomm import DDPHookState, SparseAllreduce, algorithms
from sparsecomm.comm.simulated import simulate

NAN, INF = math.nan, math.inf

# algorithm, options, what the ValueError must say (regex): each invalid value of each option
BAD = [
    # spardl
    ("spardl", {"teams": 0}, r"teams must be None .* or a positive int dividing the number of ranks, got 0"),
    ("spardl", {"teams": -2}, r"teams must be .* got -2"),
    ("spardl", {"teams": 2.0}, r"teams must be .* got 2\.0"),
    ("spardl", {"teams": NAN}, r"teams must be .* got nan"),
    ("spardl", {"teams": INF}, r"teams must be .* got inf"),
    ("spardl", {"teams": True}, r"teams must be .* got True"),
    ("spardl", {"teams": "2"}, r"teams must be .* got '2'"),
    ("spardl", {"sag": "fast"}, r"sag must be one of 'auto', .* got 'fast'"),
    ("spardl", {"sag": None}, r"sag must be one of .* got None"),
    ("spardl", {"sag": "recursive", "teams": 3}, r"needs teams to be a power of two, got teams=3; use sag='bruck'"),
    # sparcml: the alpha-beta model's constants
    ("sparcml", {"alpha": INF}, r"alpha must be a finite number >= 0 \(seconds per message.*got inf"),
    ("sparcml", {"beta": INF}, r"beta must be a finite number >= 0 \(seconds per byte.*got inf"),
    ("sparcml", {"beta": -INF}, r"beta must be a finite number >= 0 .*got -inf"),
    ("sparcml", {"alpha": NAN}, r"alpha must be a finite number >= 0 .*got nan"),
    ("sparcml", {"beta": NAN}, r"beta must be a finite number >= 0 .*got nan"),
    ("sparcml", {"alpha": -1e-6}, r"alpha must be .*got -1e-06"),
    ("sparcml", {"beta": -1}, r"beta must be .*got -1"),
    ("sparcml", {"alpha": True}, r"alpha must be .*got True"),
    ("sparcml", {"beta": "8e-9"}, r"beta must be .*got '8e-9'"),
    ("sparcml", {"alpha": None}, r"alpha must be .*got None"),
    # topkdsa
    ("topkdsa", {"quantize_bits": 4.0}, r"quantize_bits must be None, 4 or 8 \(an int\), got 4\.0"),
    ("topkdsa", {"quantize_bits": 2}, r"quantize_bits must be None, 4 or 8 .*got 2"),
    ("topkdsa", {"quantize_bits": 0}, r"quantize_bits must be .*got 0"),
    ("topkdsa", {"quantize_bits": NAN}, r"quantize_bits must be .*got nan"),
    ("topkdsa", {"quantize_bits": True}, r"quantize_bits must be .*got True"),
    ("topkdsa", {"quantize_bits": "8"}, r"quantize_bits must be .*got '8'"),
    ("topkdsa", {"bucket_size": 0}, r"bucket_size must be an integer in 1\.\.2147483647 .*got 0"),
    ("topkdsa", {"bucket_size": -512}, r"bucket_size must be .*got -512"),
    ("topkdsa", {"bucket_size": 2**31}, r"bucket_size must be an integer in 1\.\.2147483647 .*got 2147483648"),
    ("topkdsa", {"bucket_size": 512.0}, r"bucket_size must be .*got 512\.0"),
    ("topkdsa", {"bucket_size": INF}, r"bucket_size must be .*got inf"),
    ("topkdsa", {"bucket_size": True}, r"bucket_size must be .*got True"),
    ("topkdsa", {"quantize_bits": 4, "bucket_size": 3}, r"bucket_size must be .*\(even with quantize_bits=4\), got 3"),
    ("topkdsa", {"seed": 1.5}, r"seed must be an integer, got 1\.5"),
    ("topkdsa", {"seed": NAN}, r"seed must be an integer, got nan"),
    ("topkdsa", {"seed": None}, r"seed must be an integer, got None"),
    ("topkdsa", {"seed": True}, r"seed must be an integer, got True"),
    # gssgd
    ("gssgd", {"rows": 0}, r"rows must be an int in 1\.\.64, got 0"),
    ("gssgd", {"rows": 65}, r"rows must be an int in 1\.\.64, got 65"),
    ("gssgd", {"rows": -7}, r"rows must be .*got -7"),
    ("gssgd", {"rows": 7.0}, r"rows must be .*got 7\.0"),
    ("gssgd", {"rows": True}, r"rows must be .*got True"),
    ("gssgd", {"rows": None}, r"rows must be .*got None"),
    ("gssgd", {"columns": 0}, r"columns must be None \(auto: from sketch_size\) or an int in 1\.\.4294967295, got 0"),
    ("gssgd", {"columns": -256}, r"columns must be .*got -256"),
    ("gssgd", {"columns": 2**32}, r"columns must be .*in 1\.\.4294967295, got 4294967296"),
    ("gssgd", {"columns": 256.0}, r"columns must be .*got 256\.0"),
    ("gssgd", {"columns": INF}, r"columns must be .*got inf"),
    ("gssgd", {"columns": True}, r"columns must be .*got True"),
    ("gssgd", {"seed": 1.0}, r"seed must be an int, got 1\.0"),
    ("gssgd", {"seed": "0"}, r"seed must be an int, got '0'"),
    ("gssgd", {"seed": None}, r"seed must be an int, got None"),
    ("gssgd", {"heavymix": "TOPK"}, r"heavymix must be 'topk' or 'random', got 'TOPK'"),
    ("gssgd", {"heavymix": None}, r"heavymix must be .*got None"),
    ("gssgd", {"sketch_size": 0}, r"sketch_size \(sketch cells per selected entry\) must be None \(auto: sized to the candidates' "
                                 r"heavy-hitter guarantee\) or a finite number > 0, got 0"),
    ("gssgd", {"sketch_size": -1.5}, r"sketch_size .*got -1\.5"),
    ("gssgd", {"sketch_size": NAN}, r"sketch_size .*got nan"),
    ("gssgd", {"sketch_size": INF}, r"sketch_size .*got inf"),
    ("gssgd", {"sketch_size": "10"}, r"sketch_size .*got '10'"),
    ("gssgd", {"sketch_size": True}, r"sketch_size .*got True"),
    ("gssgd", {"p1": 0.5}, r"p1 \(each rank sketches its local top-p1\*k\) must be None \(sketch all of acc\) or a "
                           r"finite number >= 1, got 0\.5"),
    ("gssgd", {"p1": NAN}, r"p1 .*got nan"),
    ("gssgd", {"p1": INF}, r"p1 .*got inf"),
    ("gssgd", {"p1": "1"}, r"p1 .*got '1'"),
    ("gssgd", {"p2": 0.99}, r"p2 \(p2\*k candidates in the exact round\) must be a finite number >= 1, got 0\.99"),
    ("gssgd", {"p2": None}, r"p2 .*got None"),
    ("gssgd", {"p2": NAN}, r"p2 .*got nan"),
    ("gssgd", {"p2": -INF}, r"p2 .*got -inf"),
    ("gssgd", {"allreduce": "ring"}, r"allreduce must be 'scatter' or 'tree', got 'ring'"),
    ("gssgd", {"allreduce": None}, r"allreduce must be .*got None"),
    ("gssgd", {"estimate": "part"}, r"estimate must be 'sliced' or 'full', got 'part'"),
    ("gssgd", {"estimate": None}, r"estimate must be .*got None"),
    # oktopk
    ("oktopk", {"tau": 0}, r"tau must be an integer number of steps in \[1, 2\^31 - 1\], got 0"),
    ("oktopk", {"tau": 1.5}, r"tau must be .* got 1\.5"),
    ("oktopk", {"tau": NAN}, r"tau must be .* got nan"),
    ("oktopk", {"tau": True}, r"tau must be .* got True"),
    ("oktopk", {"tau_prime": -3}, r"tau_prime must be .* got -3"),
    ("oktopk", {"tau_prime": INF}, r"tau_prime must be .* got inf"),
    ("oktopk", {"tau_prime": 2**31}, r"tau_prime must be .* got 2147483648"),
]
# the COO codec options (sparsecomm.formats.codec), the same on every algorithm that takes them
_CODEC_BAD = [
    ({"index_codec": "zstd"}, r"index_codec must be 'none' or 'delta_binary', got 'zstd'"),
    ({"index_codec": None}, r"index_codec must be .*got None"),
    ({"value_codec": "qsgd"}, r"value_codec must be 'none' or 'skcompress', got 'qsgd'"),
    ({"value_codec": True}, r"value_codec must be .*got True"),
    ({"q": 255}, r"q must be an even int in 2\.\.4096 .*got 255"),
    ({"q": 0}, r"q must be .*got 0"),
    ({"q": 8192}, r"q must be .*got 8192"),
    ({"q": 256.0}, r"q must be .*got 256\.0"),
    ({"q": NAN}, r"q must be .*got nan"),
    ({"s": 0}, r"s must be an int in 1\.\.16 .*got 0"),
    ({"s": 17}, r"s must be .*got 17"),
    ({"s": True}, r"s must be .*got True"),
    ({"t": 0}, r"t must be a number in \(0, 64\] .*got 0"),
    ({"t": -0.5}, r"t must be .*got -0\.5"),
    ({"t": NAN}, r"t must be .*got nan"),
    ({"t": INF}, r"t must be .*got inf"),
    ({"t": 65}, r"t must be .*got 65"),
    ({"t": "0.2"}, r"t must be .*got '0\.2'"),
    ({"r": 0}, r"r must be an int in 1\.\.min\(255, q/2\) .*got 0"),
    ({"r": 129}, r"r must be .*got 129"),
    ({"r": 2, "q": 2}, r"r must be .*got 2"),
    ({"r": 8.0}, r"r must be .*got 8\.0"),
    ({"m": 3}, r"m must be 'auto', 2, 4, 8 or 16 .*got 3"),
    ({"m": True}, r"m must be .*got True"),
    ({"m": None}, r"m must be .*got None"),
    ({"prefix": "none"}, r"prefix must be 'auto', 'fixed' or 'huffman', got 'none'"),
    ({"prefix": 1}, r"prefix must be .*got 1"),
]
BAD += [(name, options, message) for name in algorithms.names() for options, message in _CODEC_BAD
        if set(options) <= set(algorithms.get(name).option_defaults)]
BAD += [("skcompress", {"topology": "ring"}, r"topology must be 'allgather' or 'ps', got 'ring'"),
        ("skcompress", {"topology": None}, r"topology must be .*got None")]
BAD += [  # zen: the hash's seed, its block (a power of two), the pull form
    ("zen", {"seed": -1}, r"seed must be an int in 0\.\.9223372036854775807 .*got -1"),
    ("zen", {"seed": 1.5}, r"seed must be .*got 1\.5"),
    ("zen", {"block": 0}, r"block must be 'auto' or a power of two in 1\.\.1073741824 .*got 0"),
    ("zen", {"block": 48}, r"block must be 'auto' or a power of two .*got 48"),
    ("zen", {"block": 2**31}, r"block must be 'auto' or a power of two .*got 2147483648"),
    ("zen", {"block": "fine"}, r"block must be 'auto' or a power of two .*got 'fine'"),
    ("zen", {"block": True}, r"block must be 'auto' or a power of two .*got True"),
    ("zen", {"pull_form": "coo"}, r"pull_form must be 'auto', 'index', 'bitmap' or 'dense' .*got 'coo'"),
]
BAD += [  # auto: the alpha-beta constants (both or neither), the candidates, the compute table
    ("auto", {"alpha": -1e-6, "beta": 1e-9}, r"option alpha must be None .* got -1e-06"),
    ("auto", {"alpha": NAN, "beta": 1e-9}, r"option alpha must be .* got nan"),
    ("auto", {"alpha": 1e-4, "beta": INF}, r"option beta must be .* got inf"),
    ("auto", {"alpha": True, "beta": 1e-9}, r"option alpha must be .* got True"),
    ("auto", {"alpha": 1e-4}, r"give both alpha and beta, or neither"),
    ("auto", {"beta": 1e-9}, r"give both alpha and beta, or neither"),
    ("auto", {"candidates": "topka"}, r"candidates must be a non-empty tuple .* got 'topka'"),
    ("auto", {"candidates": ()}, r"candidates must be a non-empty tuple"),
    ("auto", {"candidates": ("auto",)}, r"candidates \['auto'\] cannot be chosen"),
    ("auto", {"candidates": ("nosuch", "topka")}, r"candidates \['nosuch'\] cannot be chosen"),
    ("auto", {"compute": {"topka": -1.0}}, r"compute must be None or a dict"),
    ("auto", {"compute": {"topka": NAN}}, r"compute must be None or a dict"),
    ("auto", {"compute": [1.0]}, r"compute must be None or a dict"),
    ("auto", {"tune": -1}, r"option tune must be an int in 0\.\.1000, got -1"),
    ("auto", {"tune": True}, r"option tune must be an int in 0\.\.1000, got True"),
    ("auto", {"shortlist": 0}, r"option shortlist must be an int in 1\.\.1000, got 0"),
    ("auto", {"margin": 0.9}, r"option margin must be a finite number >= 1 .* got 0\.9"),
    ("auto", {"margin": NAN}, r"option margin must be a finite number >= 1 .* got nan"),
    ("auto", {"codecs": 1}, r"option codecs must be a bool .* got 1"),
    ("auto", {"codecs": None}, r"option codecs must be a bool .* got None"),
    ("auto", {"candidates": ("topka+zip",)}, r"candidate 'topka\+zip': after '\+' come codecs"),
    ("auto", {"candidates": ("gtopk+delta_binary",)}, r"candidates \['gtopk\+delta_binary'\] cannot be chosen"),
]

# values at the edges that are valid and must be accepted
GOOD = [
    ("spardl", {"teams": None}), ("spardl", {"teams": 3}), ("spardl", {"teams": 1, "sag": "recursive"}),
    ("spardl", {"teams": 6, "sag": "bruck"}), ("spardl", {"sag": "auto"}),
    ("sparcml", {"alpha": 0, "beta": 0}), ("sparcml", {"alpha": 0.0, "beta": 1}), ("sparcml", {"alpha": 1e-3}),
    ("topkdsa", {"quantize_bits": None}), ("topkdsa", {"quantize_bits": 8, "bucket_size": 1}),
    ("topkdsa", {"quantize_bits": 4, "bucket_size": 2}), ("topkdsa", {"bucket_size": 2**31 - 1}),
    ("topkdsa", {"seed": -1}), ("topkdsa", {"seed": 2**70}),
    ("gssgd", {"rows": 1, "columns": 1}), ("gssgd", {"rows": 64, "columns": 2**32 - 1}),
    ("gssgd", {"columns": None}), ("gssgd", {"seed": -1}), ("gssgd", {"seed": 2**64}),
    ("gssgd", {"heavymix": "random"}),
    ("gssgd", {"p1": None, "p2": 1, "sketch_size": 1e-9}), ("gssgd", {"p1": 1, "p2": 1.0}),
    ("gssgd", {"allreduce": "tree"}), ("gssgd", {"estimate": "full"}),
    ("topka", {"index_codec": "delta_binary", "value_codec": "skcompress", "q": 2, "s": 16, "t": 64, "r": 1,
               "m": 16, "prefix": "huffman"}),
    ("gtopk", {"q": 4096, "r": 255, "t": 1e-9, "m": "auto", "prefix": "fixed"}),
    ("skcompress", {"topology": "ps", "q": 2, "r": 1}),
    ("oktopk", {"tau": 1, "tau_prime": 1}), ("oktopk", {"tau": 2**31 - 1, "tau_prime": 2**31 - 1}),
    ("auto", {"tune": 0, "shortlist": 1, "margin": 1}), ("auto", {"tune": 1000, "shortlist": 1000, "margin": 1e9}),
]


def _ids(cases):
    return [f"{name}-{'-'.join(f'{k}={v!r}' for k, v in options.items())}" for name, options, *_ in cases]


@pytest.mark.parametrize("name,options,message", BAD, ids=_ids(BAD))
def test_invalid_option_fails_at_construction(name, options, message):
    cls = algorithms.get(name)
    with pytest.raises(ValueError, match=rf"^{name}: .*{message}"):
        cls(None, **options)
    # the same check where users give options: the hook state and the reducer
    with pytest.raises(ValueError, match=message):
        DDPHookState(name, 0.1, **options)


@pytest.mark.parametrize("name,options", GOOD, ids=_ids(GOOD))
def test_valid_edge_values_are_accepted(name, options):
    algorithms.get(name)(None, **options)
    DDPHookState(name, 0.1, **options)


def test_every_option_of_every_algorithm_has_invalid_cases():
    covered = {(name, option) for name, options, _ in BAD for option in options}
    missing = [(name, option) for name in algorithms.names()
               for option in algorithms.get(name).option_defaults if (name, option) not in covered]
    assert missing == [], "add invalid values of these options to BAD"


@pytest.mark.parametrize("name", algorithms.names())
def test_unknown_option_names_the_accepted_ones(name):
    accepted = ", ".join(sorted(algorithms.get(name).option_defaults)) or "none"
    with pytest.raises(ValueError, match=rf"algorithm '{name}' does not take option\(s\) tems; "
                                         rf"accepted options: {accepted}$"):
        algorithms.get(name)(None, tems=2)


# what the reducer and the hook state take besides the algorithm's options
DENSITIES = [0, -0.1, 1.5, NAN, INF, -INF, True, "0.1", None]


@pytest.mark.parametrize("density", DENSITIES, ids=repr)
def test_invalid_density_fails_at_construction(density):
    with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\], got "):
        DDPHookState("topka", density)
    with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\], got "):
        SparseAllreduce("topka", density)  # before any Comm is made


@pytest.mark.parametrize("warmup", [-1, 1.5, NAN, INF, True, "3", None], ids=repr)
def test_invalid_warmup_steps_fail_at_construction(warmup):
    with pytest.raises(ValueError, match=r"warmup_steps must be an integer >= 0, got "):
        DDPHookState("topka", 0.1, warmup_steps=warmup)


# -- options that need the number of ranks --------------------------------------------------


@pytest.mark.parametrize("size,teams", [(4, 3), (6, 4), (2, 4), (5, 2)])
def test_teams_not_dividing_p_fails_on_every_rank_before_any_message(size, teams):
    def rank(comm):
        try:
            SparseAllreduce("spardl", 0.1, comm=comm, teams=teams)
        except ValueError as exc:
            error = str(exc)
        else:
            error = None
        try:
            DDPHookState("spardl", 0.1, comm=comm, teams=teams)  # P known: fails at construction
        except ValueError as exc:
            assert str(exc) == error
        return error, comm.stats.bytes_sent + comm.stats.rounds

    result = simulate(size, rank)
    errors = {error for error, _ in result.results}
    assert len(errors) == 1, errors
    error = errors.pop()
    assert error is not None and error.startswith(f"spardl: teams={teams} does not divide the number of ranks "
                                                  f"P={size}; valid choices for P={size}: ")
    assert all(sent == 0 for _, sent in result.results)


def _first_call_rank(rank, size, state):
    """The state was made (and pickled here) while P was unknown; its first use of the Comm
    is the first call of the hook."""
    try:
        state.comm
    except ValueError as exc:
        return str(exc), state._comm is None
    return None, state._comm is None


def test_teams_is_checked_at_the_first_call_when_p_was_unknown():
    from sparsecomm.testing import spawn

    state = DDPHookState("spardl", 0.1, teams=3)  # no process group yet: P unknown, accepted
    results = spawn(_first_call_rank, 2, state)
    assert results == [("spardl: teams=3 does not divide the number of ranks P=2; valid choices for P=2: 1, 2",
                        True)] * 2, "every rank fails the same way, before its TorchComm exists"


# -- every declared option rejects a value of each kind it must refuse -----------------------

# per option: a value of the wrong type, one out of range, one that is not a choice (the kinds
# the option has); written here, not read from the declarations
_CODEC_REJECTS = {
    "index_codec": {"type": 1, "choice": "zstd"},
    "value_codec": {"type": 0.0, "choice": "qsgd"},
    "q": {"type": "256", "range": 4098},
    "s": {"type": 2.0, "range": 17},
    "t": {"type": "0.2", "range": 0},
    "r": {"type": 8.0, "range": 256},
    "m": {"type": True, "choice": 3},
    "prefix": {"type": 0, "choice": "none"},
}
_SKCOMPRESS_CODEC = {k: v for k, v in _CODEC_REJECTS.items() if k not in ("index_codec", "value_codec")}
REJECTS = {
    "dense": {},
    "densestream": {},
    "topka": _CODEC_REJECTS,
    "gtopk": _CODEC_REJECTS,
    "sparcml_recursive_double": _CODEC_REJECTS,
    "sparcml_split_allgather": _CODEC_REJECTS,
    "spardl": {"teams": {"type": 2.0, "range": 0}, "sag": {"type": 1, "choice": "fast"}, **_CODEC_REJECTS},
    "oktopk": {"tau": {"type": 1.5, "range": 0}, "tau_prime": {"type": "64", "range": 2**31}, **_CODEC_REJECTS},
    "topkdsa": {"quantize_bits": {"type": 4.0, "choice": 2}, "bucket_size": {"type": 512.0, "range": 2**31},
                "seed": {"type": 1.5}, **_CODEC_REJECTS},
    "sparcml": {"alpha": {"type": "5e-5", "range": -1e-6}, "beta": {"type": None, "range": -1}, **_CODEC_REJECTS},
    "skcompress": {"topology": {"type": 0, "choice": "ring"}, **_SKCOMPRESS_CODEC},
    "gssgd": {"rows": {"type": 5.0, "range": 65}, "sketch_size": {"type": "10", "range": 0},
              "columns": {"type": 256.0, "range": 2**32}, "p1": {"type": "1", "range": 0.5},
              "p2": {"type": None, "range": 0.99}, "allreduce": {"type": 0, "choice": "ring"},
              "estimate": {"type": 0, "choice": "part"}, "seed": {"type": 1.0},
              "heavymix": {"type": 0, "choice": "TOPK"}},
    "zen": {"seed": {"type": 1.0, "range": -1}, "block": {"type": 64.0, "range": 3},
            "pull_form": {"type": 1, "choice": "coo"}, **_CODEC_REJECTS},
    "auto": {"alpha": {"type": "1e-4", "range": -1e-6}, "beta": {"type": True, "range": -INF},
             "candidates": {"type": "topka", "range": ()}, "compute": {"type": [1.0], "range": {"topka": -1.0}},
             "tune": {"type": 2.0, "range": 1001}, "shortlist": {"type": None, "range": 0},
             "margin": {"type": "2", "range": 0.5}, "codecs": {"type": "yes"}},
}
# options given beside the bad one so that the case reaches that option's own check
_BESIDE = {("auto", "alpha"): {"beta": 1e-9}, ("auto", "beta"): {"alpha": 1e-4}}
_REJECT_CASES = [(name, option, kind, value) for name, options in REJECTS.items()
                 for option, kinds in options.items() for kind, value in kinds.items()]


def test_the_rejection_table_covers_every_algorithm_and_option():
    assert sorted(REJECTS) == algorithms.names()
    for name, options in REJECTS.items():
        assert sorted(options) == sorted(algorithms.get(name).option_defaults), name


@pytest.mark.parametrize("name,option,kind,value", _REJECT_CASES,
                         ids=[f"{n}-{o}-{k}" for n, o, k, _ in _REJECT_CASES])
def test_each_option_rejects_each_kind_of_bad_value(name, option, kind, value):
    with pytest.raises(ValueError) as caught:
        algorithms.get(name)(None, **_BESIDE.get((name, option), {}), **{option: value})
    # the algorithm, the option, what it takes, and the value given
    assert re.fullmatch(rf"{name}: (option )?{option}( \(.*\))? must be .+, got {re.escape(repr(value))}",
                        str(caught.value)), str(caught.value)


# -- the declarations themselves (sparsecomm.options) ----------------------------------------


def test_a_declaration_checks_type_bounds_choices_and_a_condition_with_one_message():
    from sparsecomm.options import Option, check_declared

    specs = {"n": Option(4, int, min=2, max=8, even=True, doc="slots"),
             "x": Option(None, float, min=0, min_open=True, none_doc="measured"),
             "mode": Option("a", str, choices=("a", "b", "c")),
             "half": Option(1, int, min=1, check=lambda v, options: v <= options["n"] // 2, what="an int <= n/2")}
    check_declared("demo", specs, {"n": 8, "x": None, "mode": "c", "half": 4})
    check_declared("demo", specs, {"n": 2, "x": 1e-300, "mode": "a", "half": 1})
    cases = [({"n": 3}, "demo: n must be an even int in 2..8 (slots), got 3"),
             ({"n": 10}, "demo: n must be an even int in 2..8 (slots), got 10"),
             ({"n": True}, "demo: n must be an even int in 2..8 (slots), got True"),
             ({"n": 4.0}, "demo: n must be an even int in 2..8 (slots), got 4.0"),
             ({"x": 0}, "demo: x must be None (measured) or a finite number > 0, got 0"),
             ({"x": NAN}, "demo: x must be None (measured) or a finite number > 0, got nan"),
             ({"x": False}, "demo: x must be None (measured) or a finite number > 0, got False"),
             ({"mode": "d"}, "demo: mode must be 'a', 'b' or 'c', got 'd'"),
             ({"mode": None}, "demo: mode must be 'a', 'b' or 'c', got None"),
             ({"half": 3}, "demo: half must be an int <= n/2, got 3"),
             ({"half": True}, "demo: half must be an int <= n/2, got True")]  # a bool is no int here
    for given, message in cases:
        with pytest.raises(ValueError) as caught:
            check_declared("demo", specs, {"n": 4, "x": None, "mode": "a", "half": 1, **given})
        assert str(caught.value) == message


# -- what the reducer's handshake compares ---------------------------------------------------

# the options as the handshake encodes them (SparseAllreduce.options_text: its CRC is sent), with
# the defaults and with every option given: ranks on builds that encode them differently would
# refuse each other, so these texts must not change
_CODEC_GIVEN = {"index_codec": "delta_binary", "value_codec": "skcompress", "q": 64, "s": 3, "t": 0.5, "r": 4,
                "m": 8, "prefix": "huffman"}
_GIVEN = {
    "dense": {}, "densestream": {},
    "topka": _CODEC_GIVEN, "gtopk": _CODEC_GIVEN, "sparcml_recursive_double": _CODEC_GIVEN,
    "sparcml_split_allgather": _CODEC_GIVEN,
    "spardl": {"teams": 2, "sag": "bruck", **_CODEC_GIVEN}, "oktopk": {"tau": 5, "tau_prime": 7, **_CODEC_GIVEN},
    "topkdsa": {"quantize_bits": 4, "bucket_size": 64, "seed": 3, **_CODEC_GIVEN},
    "sparcml": {"alpha": 1e-5, "beta": 2e-9, **_CODEC_GIVEN},
    "skcompress": {"q": 64, "s": 3, "t": 0.5, "r": 4, "m": 8, "prefix": "huffman", "topology": "ps"},
    "gssgd": {"rows": 3, "sketch_size": 10, "columns": 999, "p1": None, "p2": 4, "allreduce": "tree",
              "estimate": "full", "seed": 7, "heavymix": "random"},
    "auto": {"alpha": 1e-5, "beta": 1e-9, "candidates": ["topka", "gtopk", "spardl+delta_binary+skcompress"],
             "compute": {"topka": 1.0}, "tune": 0, "shortlist": 2, "margin": 1.5, "codecs": False},
}
HANDSHAKE_TEXT = {
    ("auto", "default"):
        "alpha=None, beta=None, candidates=None, codecs=True, compute=None, margin=2.0, nonfinite='propagate', "
        "shortlist=4, tune=2",
    ("auto", "given"):
        "alpha=1e-05, beta=1e-09, candidates=('topka', 'gtopk', 'spardl+delta_binary+skcompress'), codecs=False, "
        "compute={'topka': 1.0}, margin=1.5, nonfinite='propagate', shortlist=2, tune=0",
    ("dense", "default"): "nonfinite='propagate'",
    ("dense", "given"): "nonfinite='propagate'",
    ("densestream", "default"): "nonfinite='propagate'",
    ("densestream", "given"): "nonfinite='propagate'",
    ("gssgd", "default"):
        "allreduce='scatter', columns=None, estimate='sliced', heavymix='topk', nonfinite='propagate', "
        "p1=1.0, p2=8.0, rows=5, seed=24301, sketch_size=None",
    ("gssgd", "given"):
        "allreduce='tree', columns=999, estimate='full', heavymix='random', nonfinite='propagate', "
        "p1=None, p2=4, rows=3, seed=7, sketch_size=10",
    ("gtopk", "default"):
        "index_codec='none', m='auto', nonfinite='propagate', prefix='auto', q=256, r=8, s=2, t=0.2, "
        "value_codec='none'",
    ("gtopk", "given"):
        "index_codec='delta_binary', m=8, nonfinite='propagate', prefix='huffman', q=64, r=4, s=3, t=0.5,"
        " value_codec='skcompress'",
    ("oktopk", "default"):
        "index_codec='none', m='auto', nonfinite='propagate', prefix='auto', q=256, r=8, s=2, t=0.2, "
        "tau=32, tau_prime=64, value_codec='none'",
    ("oktopk", "given"):
        "index_codec='delta_binary', m=8, nonfinite='propagate', prefix='huffman', q=64, r=4, s=3, t=0.5,"
        " tau=5, tau_prime=7, value_codec='skcompress'",
    ("skcompress", "default"):
        "m='auto', nonfinite='propagate', prefix='auto', q=256, r=8, s=2, t=0.2, topology='allgather'",
    ("skcompress", "given"): "m=8, nonfinite='propagate', prefix='huffman', q=64, r=4, s=3, t=0.5, topology='ps'",
    ("sparcml", "default"):
        "alpha=5e-05, beta=8e-09, index_codec='none', m='auto', nonfinite='propagate', prefix='auto', "
        "q=256, r=8, s=2, t=0.2, value_codec='none'",
    ("sparcml", "given"):
        "alpha=1e-05, beta=2e-09, index_codec='delta_binary', m=8, nonfinite='propagate', "
        "prefix='huffman', q=64, r=4, s=3, t=0.5, value_codec='skcompress'",
    ("sparcml_recursive_double", "default"):
        "index_codec='none', m='auto', nonfinite='propagate', prefix='auto', q=256, r=8, s=2, t=0.2, "
        "value_codec='none'",
    ("sparcml_recursive_double", "given"):
        "index_codec='delta_binary', m=8, nonfinite='propagate', prefix='huffman', q=64, r=4, s=3, t=0.5,"
        " value_codec='skcompress'",
    ("sparcml_split_allgather", "default"):
        "index_codec='none', m='auto', nonfinite='propagate', prefix='auto', q=256, r=8, s=2, t=0.2, "
        "value_codec='none'",
    ("sparcml_split_allgather", "given"):
        "index_codec='delta_binary', m=8, nonfinite='propagate', prefix='huffman', q=64, r=4, s=3, t=0.5,"
        " value_codec='skcompress'",
    ("spardl", "default"):
        "index_codec='none', m='auto', nonfinite='propagate', prefix='auto', q=256, r=8, s=2, sag='auto',"
        " t=0.2, teams=None, value_codec='none'",
    ("spardl", "given"):
        "index_codec='delta_binary', m=8, nonfinite='propagate', prefix='huffman', q=64, r=4, s=3, "
        "sag='bruck', t=0.5, teams=2, value_codec='skcompress'",
    ("topka", "default"):
        "index_codec='none', m='auto', nonfinite='propagate', prefix='auto', q=256, r=8, s=2, t=0.2, "
        "value_codec='none'",
    ("topka", "given"):
        "index_codec='delta_binary', m=8, nonfinite='propagate', prefix='huffman', q=64, r=4, s=3, t=0.5,"
        " value_codec='skcompress'",
    ("topkdsa", "default"):
        "bucket_size=512, index_codec='none', m='auto', nonfinite='propagate', prefix='auto', q=256, "
        "quantize_bits=None, r=8, s=2, seed=0, t=0.2, value_codec='none'",
    ("topkdsa", "given"):
        "bucket_size=64, index_codec='delta_binary', m=8, nonfinite='propagate', prefix='huffman', q=64, "
        "quantize_bits=4, r=4, s=3, seed=3, t=0.5, value_codec='skcompress'",
}


@pytest.mark.parametrize("name,label", sorted(HANDSHAKE_TEXT), ids=[f"{n}-{l}" for n, l in sorted(HANDSHAKE_TEXT)])
def test_the_handshake_text_of_each_algorithms_options(name, label):
    options = _GIVEN[name] if label == "given" else {}
    result = simulate(2, lambda comm: SparseAllreduce(name, 0.1, comm=comm, **options).options_text())
    assert result.results == [HANDSHAKE_TEXT[name, label]] * 2
