"""Wire formats: every payload a peer sends is a uint8 tensor in a documented layout.

Nothing received is ever unpickled. See :mod:`.header` for the common 32-byte header and
:mod:`.coo` for sparse COO messages.
"""

from .coo import coo_nbytes, decode_coo, encode_coo
from .header import (FORMAT_VERSION, HEADER_NBYTES, Kind, WireFormatError, check_header, index_dtype_for,
                     pack_header, parse_header)

__all__ = ["coo_nbytes", "decode_coo", "encode_coo", "FORMAT_VERSION", "HEADER_NBYTES", "Kind",
           "WireFormatError", "check_header", "index_dtype_for", "pack_header", "parse_header"]
