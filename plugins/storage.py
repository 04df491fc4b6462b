"""Storage formats by bits per element and per-group scale overhead, and the 6-bit codec.

A format says how many bits one element takes and, for block-quantized
formats, how many elements share one scale and how many bytes that scale
takes. Bytes are exact: a row is padded to whole bytes, and a row of a packed
matrix pays one scale per started group (packed W4 with a 4-byte scale per 32:
``ceil(width / 2) + 4 * ceil(width / 32)`` bytes a row).

The 6-bit codec stores four codes 0..63 in three bytes, so its
persistent state is 0.75 byte per weight. Within each group of four codes
``c0..c3`` of a row the bytes are::

    byte0 = c0        | (c1 & 0b11) << 6
    byte1 = c1 >> 2   | (c2 & 0b1111) << 4
    byte2 = c2 >> 4   | c3 << 2

torch is imported only when the codec runs.
"""
from __future__ import annotations

import math
import operator
from fractions import Fraction
from typing import Any, Dict, Optional, Tuple

import attrs

from ndcost.errors import InvalidValue
from ndcost.hookspecs import hookimpl
from ndcost.values import non_negative_int, positive_int


def exact_int(what: str, value: Any, minimum: int = 0) -> int:
    """*value* as an exact int >= *minimum*: byte counts stay Python ints, bools and fractions are refused."""
    number = None
    if not isinstance(value, bool):
        try:
            number = operator.index(value)
        except TypeError:
            if isinstance(value, float) and value.is_integer():
                number = int(value)
    if number is None or number < minimum:
        raise InvalidValue(f"{what} must be an integer >= {minimum}, got {value!r}")
    return number


@attrs.frozen(kw_only=True)
class StorageFormat:
    """How a tensor is stored: bits an element, and one scale of ``scale_bytes`` per ``group_size`` elements.

    ``width_multiple`` is the row width the packing needs (4 for the 6-bit
    codec, which packs four codes into three bytes); other widths are refused
    rather than rounded. ``aliases`` are other spellings a lookup accepts
    (``bfloat16`` for ``bf16``): the format declares them, so a third party's
    format brings its own.
    """

    name: str
    bits_per_element: int = attrs.field(validator=positive_int)
    group_size: Optional[int] = attrs.field(default=None, validator=attrs.validators.optional(positive_int))
    scale_bytes: int = attrs.field(default=0, validator=non_negative_int)
    width_multiple: int = attrs.field(default=1, validator=positive_int)
    aliases: Tuple[str, ...] = attrs.field(default=(), converter=lambda v: tuple(str(a).lower() for a in v))
    description: str = ""

    def __attrs_post_init__(self):
        if (self.group_size is None) != (self.scale_bytes == 0):
            raise InvalidValue(f"storage format {self.name!r}: give both group_size and scale_bytes "
                               f"(a block-quantized format) or neither (a plain one)")

    # -- per element --------------------------------------------------------
    @property
    def exact_bytes_per_element(self) -> Fraction:
        """Payload plus amortized scales per element, as an exact fraction (0.625 for W4 group-32)."""
        scales = Fraction(self.scale_bytes, self.group_size) if self.group_size else Fraction(0)
        return Fraction(self.bits_per_element, 8) + scales

    @property
    def bytes_per_element(self) -> float:
        """:attr:`exact_bytes_per_element` as a float (0.75 for the 6-bit codec)."""
        return float(self.exact_bytes_per_element)

    @property
    def payload_bytes_per_element(self) -> float:
        """The codes alone, without scales."""
        return self.bits_per_element / 8

    # -- exact bytes --------------------------------------------------------
    def row_bytes(self, width: int) -> int:
        """Bytes of one packed row of *width* elements: codes padded to a byte, plus its groups' scales."""
        width = exact_int(f"storage/{self.name}: width", width)
        if width % self.width_multiple:
            raise InvalidValue(f"storage/{self.name}: width {width} is not a multiple of {self.width_multiple}; "
                               f"this format packs {self.width_multiple} elements together, pad the row "
                               f"to a multiple of {self.width_multiple}")
        scales = math.ceil(width / self.group_size) * self.scale_bytes if self.group_size else 0
        return -(-width * self.bits_per_element // 8) + scales

    def matrix_bytes(self, rows: int, width: int) -> int:
        """Bytes of a ``[rows, width]`` matrix stored row by row (each row padded and grouped alone)."""
        return exact_int(f"storage/{self.name}: rows", rows) * self.row_bytes(width)

    def tensor_bytes(self, elements: int) -> int:
        """Bytes of a tensor of *elements* elements stored as one flat run."""
        return self.row_bytes(elements)

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "bits_per_element": self.bits_per_element, "group_size": self.group_size,
                "scale_bytes": self.scale_bytes, "width_multiple": self.width_multiple,
                "bytes_per_element": self.bytes_per_element, "aliases": list(self.aliases),
                "description": self.description}


BF16 = StorageFormat(name="bf16", bits_per_element=16, aliases=("bfloat16",), description="bfloat16")
FP16 = StorageFormat(name="fp16", bits_per_element=16, aliases=("float16", "half"),
                     description="IEEE half precision")
FP32 = StorageFormat(name="fp32", bits_per_element=32, aliases=("float32", "float"),
                     description="IEEE single precision")
FP8 = StorageFormat(name="fp8", bits_per_element=8, aliases=("float8", "e4m3", "e5m2"),
                    description="float8 (e4m3 or e5m2); scales kept elsewhere")
INT8 = StorageFormat(name="int8", bits_per_element=8, aliases=("uint8",),
                     description="8-bit integer codes; scales kept elsewhere")
INT4 = StorageFormat(name="int4", bits_per_element=4, group_size=32, scale_bytes=4,
                     aliases=("w4", "packed_w4", "int4_g32"),
                     description="packed W4: two codes a byte, one fp32 scale per 32 elements of a row")
UINT6 = StorageFormat(name="uint6", bits_per_element=6, width_multiple=4,
                      aliases=("6bit", "6-bit", "int6", "packed6", "packed_6bit"),
                      description="packed 6-bit codes 0..63, four in three bytes (0.75 byte per weight)")

BUILTIN = (BF16, FP16, FP32, FP8, INT8, INT4, UINT6)


# ---------------------------------------------------------------------------
# the 6-bit codec
# ---------------------------------------------------------------------------
def _torch():
    import torch
    return torch


def pack_6bit(codes):
    """Pack uint8 codes ``[rows, in]`` (each 0..63, ``in`` divisible by 4) into uint8 ``[rows, in * 3 // 4]``."""
    torch = _torch()
    if not isinstance(codes, torch.Tensor):
        raise InvalidValue(f"pack_6bit: expected a torch uint8 tensor [rows, in], got {type(codes).__name__}")
    if codes.dim() != 2:
        raise InvalidValue(f"pack_6bit: expected a 2-D tensor [rows, in], got shape {tuple(codes.shape)}")
    if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
        raise InvalidValue(f"pack_6bit: codes must be an integer tensor (uint8), got {codes.dtype}")
    rows, width = codes.shape
    if width % 4:
        raise InvalidValue(f"pack_6bit: in_features {width} is not divisible by 4; the codec packs four "
                           f"6-bit codes into three bytes, pad the rows to a multiple of 4")
    if codes.numel():
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high > 63:
            bad = high if high > 63 else low
            raise InvalidValue(f"pack_6bit: code {bad} does not fit in 6 bits; codes must be 0..63")
    c = codes.to(torch.int32).reshape(rows, width // 4, 4)
    c0, c1, c2, c3 = c.unbind(-1)
    b0 = c0 | ((c1 & 0x03) << 6)
    b1 = (c1 >> 2) | ((c2 & 0x0F) << 4)
    b2 = (c2 >> 4) | (c3 << 2)
    return torch.stack((b0, b1, b2), dim=-1).to(torch.uint8).reshape(rows, width // 4 * 3)


def unpack_6bit(packed, in_features: int):
    """Unpack uint8 ``[rows, in_features * 3 // 4]`` back to the uint8 codes ``[rows, in_features]``."""
    torch = _torch()
    in_features = exact_int("unpack_6bit: in_features", in_features)
    if in_features % 4:
        raise InvalidValue(f"unpack_6bit: in_features {in_features} is not divisible by 4; the codec packs "
                           f"four 6-bit codes into three bytes")
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        got = packed.dtype if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise InvalidValue(f"unpack_6bit: expected a torch uint8 tensor from pack_6bit, got {got}")
    if packed.dim() != 2 or packed.shape[1] != in_features // 4 * 3:
        raise InvalidValue(f"unpack_6bit: packed shape {tuple(packed.shape)} does not hold in_features "
                           f"{in_features}: expected [rows, {in_features // 4 * 3}]")
    rows = packed.shape[0]
    p = packed.to(torch.int32).reshape(rows, in_features // 4, 3)
    b0, b1, b2 = p.unbind(-1)
    c0 = b0 & 0x3F
    c1 = (b0 >> 6) | ((b1 & 0x0F) << 2)
    c2 = (b1 >> 4) | ((b2 & 0x03) << 4)
    c3 = b2 >> 2
    return torch.stack((c0, c1, c2, c3), dim=-1).to(torch.uint8).reshape(rows, in_features)


@hookimpl
def ndcost_register(register):
    for fmt in BUILTIN:
        register(f"storage/{fmt.name}", fmt)
    register("accounting/pack_6bit", pack_6bit)
    register("accounting/unpack_6bit", unpack_6bit)
