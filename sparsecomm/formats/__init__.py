"""Wire formats: every payload a peer sends is a uint8 tensor in a documented layout.

Nothing received is ever unpickled. See :mod:`.header` for the common 32-byte header,
:mod:`.coo` for sparse COO messages, :mod:`.codec` for COO messages through the SKCompress codecs, :mod:`.stream` for SparCML's sparse streams and QSGD
ranges, and :mod:`.zen` for ZEN's push and pull messages over hash classes. Only layouts live here: the validating decoders run the wire checks, and :mod:`.codec` its
encoder and decoder, through the public op layer (:mod:`sparsecomm.ops`, which never imports
this package); the arithmetic on what they decode belongs to the algorithms.
"""

from .codec import CODEC_OPTION_DEFAULTS, CODEC_OPTIONS, CooCodec
from .coo import coo_nbytes, decode_coo, encode_coo
from .header import (FORMAT_VERSION, HEADER_NBYTES, Kind, WireFormatError, check_header, index_dtype_for,
                     pack_header, parse_header)

__all__ = ["CODEC_OPTION_DEFAULTS", "CODEC_OPTIONS", "CooCodec", "coo_nbytes", "decode_coo", "encode_coo", "FORMAT_VERSION", "HEADER_NBYTES", "Kind",
           "WireFormatError", "check_header", "index_dtype_for", "pack_header", "parse_header"]
