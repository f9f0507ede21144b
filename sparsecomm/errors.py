"""Exception types of sparsecomm that more than one layer raises.

They live apart from every layer (ops, formats, comm, algorithms import them; this
module imports nothing of sparsecomm), so no layer has to import another to raise one.
"""

from __future__ import annotations

__all__ = ["WireFormatError", "AgreedValueError"]


class WireFormatError(ValueError):
    """A received message does not match what the receiver expects.

    Raised by the wire decoders (``sparsecomm.formats``) and by the kernels that
    validate peer data (status ``SC_ERR_MALFORMED`` of the C ABI).
    """


class AgreedValueError(ValueError):
    """A ValueError that every rank raises together, having agreed on it through a
    collective: the reducer's handshake mismatch and ``nonfinite="raise"``. Nothing is left
    in flight, so the Comm stays usable (it is not aborted, unlike a rank-local failure).
    """
