"""A reducer call's agreement record: built, all-gathered and compared on every rank.

The record is a fixed-size message (its fields: :data:`sparsecomm.formats.header.AGREEMENT_FIELDS`,
120 bytes) that every :class:`~sparsecomm.SparseAllreduce` call all-gathers first (see
:mod:`sparsecomm.reduce.reducer`): the handshake after construction, ``reset()`` or ``load_state_dict()``,
then each call's check. Any difference in a compared field raises the same
:class:`~sparsecomm.errors.AgreedValueError` on every rank, naming the ranks and the field;
texts (sparsecomm version, algorithm, options) travel as CRCs and are named in words through
two more small all-gathers, only on that error path.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from .. import _version as _version_module
from ..comm.base import Comm
from ..errors import AgreedValueError
from ..formats.header import AGREEMENT_FIELDS, DTYPE_CODES, FORMAT_VERSION, MAGIC, AgreementKind

__all__ = ["Signature", "agree", "signature"]

#: the agreement record's fields the ranks must share (all but the non-finite flag)
_COMPARED = tuple(i for i, field in enumerate(AGREEMENT_FIELDS) if field != "nonfinite")
_FIELD = {field: i for i, field in enumerate(AGREEMENT_FIELDS)}
_KIND_WORDS = {AgreementKind.HANDSHAKE: "the first call after construction, reset() or load_state_dict()",
               AgreementKind.CALL: "a later call", AgreementKind.REUSED: "a call with another tensor, without reset()"}
#: signature fields whose value is a text sent as a hash; the error names them in words
_TEXT_FIELDS = ("sparsecomm version", "algorithm", "options")

#: a rank's fixed record fields (version, algorithm and options CRCs, density bits) and their texts
Signature = tuple[list[int], dict[str, str]]


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _version() -> str:
    """This rank's sparsecomm version, read at each handshake (not frozen at import)."""
    return str(_version_module.__version__)


def signature(algorithm_id: str, options: str, density: float) -> Signature:
    """This rank's signature, taken afresh at each handshake and kept for the later calls'
    records: texts as CRCs, the density as its float64 bits."""
    density_bits = torch.tensor([density], dtype=torch.float64, device="cpu").view(torch.int64).item()
    version = _version()
    return ([_crc(version), _crc(algorithm_id), _crc(options), density_bits],
            {"sparsecomm version": version, "algorithm": algorithm_id, "options": options})


def agree(comm: Comm, signed: Signature, kind: AgreementKind, *, n: int, dtype: torch.dtype, k: int, step: int,
          flag: int, checkpoint: int, calls: int, resets: int, algorithm: str, density: float) -> list[int]:
    """All-gather this rank's agreement record (fixed size, whatever the kind); return every
    rank's non-finite flag, or raise the same AgreedValueError on every rank naming each
    differing field and the ranks on each side. ``algorithm`` and ``density`` only name the
    reducer in the error."""
    fixed, texts = signed
    record = [0] * len(AGREEMENT_FIELDS)
    for field, value in (("magic", MAGIC), ("format version", FORMAT_VERSION), ("kind", int(kind)),
                         ("sparsecomm version", fixed[0]), ("algorithm", fixed[1]), ("options", fixed[2]),
                         ("density", fixed[3]), ("N", n), ("dtype", DTYPE_CODES.get(dtype, 0)), ("k", k),
                         ("checkpoint", int(checkpoint)), ("calls", calls), ("step", int(step)),
                         ("resets", resets), ("nonfinite", flag)):
        record[_FIELD[field]] = value
    table = comm.allgather_small(torch.tensor(record, dtype=torch.int64, device="cpu")).cpu()
    rows = table.tolist()   # compared as Python ints: one conversion, not a tensor op per field
    differing = [i for i in _COMPARED if any(row[i] != rows[0][i] for row in rows)]
    # resets alone is no disagreement: a reset on some ranks only is told by the kind (a
    # handshake meets a later call), and ranks all at a handshake after the same calls hold
    # the same state however often each reset -- counting them would make the advice below
    # (reset() on every rank, or every rank loading the same save) never agree again
    if all(AGREEMENT_FIELDS[i] == "resets" for i in differing):
        return [row[_FIELD["nonfinite"]] for row in rows]
    words = _words(comm, texts, differing, table)
    lines = []
    for i in differing:
        field = AGREEMENT_FIELDS[i]
        values = table[:, i].tolist()
        if field in words:
            values = words[field]
        elif field == "dtype":
            by_code = {code: str(d) for d, code in DTYPE_CODES.items()}
            values = [by_code.get(v, v) for v in values]
        elif field == "density":
            values = [torch.tensor([v]).view(torch.float64).item() for v in values]
        elif field == "magic":
            values = [f"#{v:x}" for v in values]
        elif field == "checkpoint":
            values = ["a fresh start" if v == 0 else f"checkpoint #{v:x}" for v in values]
        elif field == "kind":
            values = [_KIND_WORDS.get(v, f"kind {v}") for v in values]
        groups: dict[Any, list[int]] = {}
        for rank, value in enumerate(values):
            groups.setdefault(value, []).append(rank)
        lines.append(f"{field}: " + "; ".join(f"ranks {ranks} have {value}" for value, ranks in groups.items()))
    names = {AGREEMENT_FIELDS[i] for i in differing}
    advice = ("\nevery rank must call the same reducer with the same tensor size, dtype, "
              "algorithm, options (including nonfinite) and sparsecomm version")
    if names & {"kind", "resets"}:
        advice += ("\nreset() is collective: every rank must call it (and load_state_dict) between the same "
                   "calls; call reset() on every rank to start this reducer afresh"
                   + ("; a reducer serves one tensor: reset() on every rank before giving it another"
                      if bool((table[:, _FIELD["kind"]] == AgreementKind.REUSED).any()) else ""))
    if names & {"calls", "step"}:
        advice += ("\nthe ranks are at different steps: pass the same step= on every rank, and resume every "
                   "rank from the same save")
    if "checkpoint" in names:
        advice += ("\nthe ranks resumed from different checkpoints (or some from none): every rank must "
                   "load its own state from the same save, or every rank start fresh")
    what = "first call" if kind == AgreementKind.HANDSHAKE else f"call {calls}"
    raise AgreedValueError(f"rank {comm.rank}: the ranks disagree on the reduction "
                           f"({algorithm}, density {density}, this rank N={n}, {dtype}, "
                           f"{what}):\n  " + "\n  ".join(lines) + advice)


def _words(comm: Comm, texts: dict[str, str], differing: list[int], table: torch.Tensor) -> dict[str, list[str]]:
    """Every rank's text of each differing text field (version, algorithm, options), in
    words for the error message; the signature carries only their CRCs. All ranks call
    this together (they all saw the same table): one all-gather of the texts' byte
    lengths, one of the texts padded to the longest, only on this error path. Only when
    the handshake layout itself agrees (same magic and format version): a peer speaking
    another layout might not answer, so its texts are then shown by hash."""
    fields = [AGREEMENT_FIELDS[i] for i in differing if AGREEMENT_FIELDS[i] in _TEXT_FIELDS]
    if not fields:
        return {}
    if any(AGREEMENT_FIELDS[i] in ("magic", "format version") for i in differing):
        return {field: [f"#{h:x}" for h in table[:, _FIELD[field]].tolist()] for field in fields}
    raw = [texts[field].encode() for field in fields]
    lengths = comm.allgather_small(torch.tensor([len(r) for r in raw], dtype=torch.int64, device="cpu")).cpu()
    width = int(lengths.max())
    padded = torch.zeros(len(fields), width, dtype=torch.uint8, device="cpu")
    for row, data in enumerate(raw):
        if data:
            padded[row, :len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = comm.allgather_small(padded).cpu()  # (P, fields, width)
    words: dict[str, list[str]] = {}
    for j, field in enumerate(fields):
        shown = "{%s}" if field == "options" else "%r"  # options as {key=value, ...}, the rest quoted
        words[field] = [shown % bytes(gathered[rank, j, :int(lengths[rank, j])].tolist()).decode("utf-8", "replace")
                        for rank in range(gathered.shape[0])]
    return words
