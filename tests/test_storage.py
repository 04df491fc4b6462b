"""Storage formats (``storage/<name>``) and the 6-bit codec (four codes 0..63 in three bytes).

The codec's expected bytes come from that layout, checked two
ways by hand: a few worked groups, and the equivalent 24-bit little-endian
word ``c0 | c1 << 6 | c2 << 12 | c3 << 18``.
"""
from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ndcost import accounting
from ndcost.errors import InvalidValue

torch = pytest.importorskip("torch")

# name -> (bits an element, elements a scale, bytes a scale)
EXPECTED = {"bf16": (16, None, 0), "fp16": (16, None, 0), "fp32": (32, None, 0), "fp8": (8, None, 0),
            "int8": (8, None, 0), "int4": (4, 32, 4), "uint6": (6, None, 0)}


def test_builtin_formats_registered(registry):
    for name, (bits, group, scale) in EXPECTED.items():
        fmt = registry.get(f"storage/{name}")
        assert (fmt.bits_per_element, fmt.group_size, fmt.scale_bytes) == (bits, group, scale)
    assert set(EXPECTED) <= set(accounting.storage_formats())


@pytest.mark.parametrize("name,per_element", [
    ("bf16", 2), ("fp16", 2), ("fp32", 4), ("fp8", 1), ("int8", 1),
    ("int4", Fraction(1, 2) + Fraction(4, 32)),     # half a byte of code + a 4-byte scale per 32
    ("uint6", Fraction(3, 4)),                      # four codes in three bytes
])
def test_bytes_per_element(name, per_element):
    fmt = accounting.storage_format(name)
    assert fmt.exact_bytes_per_element == per_element
    assert fmt.bytes_per_element == float(per_element)


def test_six_bit_reports_three_quarters_of_a_byte_per_weight():
    assert accounting.storage_format("6bit").bytes_per_element == 0.75
    # a 4096 x 4096 matrix of 6-bit codes: 3 bytes per 4 weights
    assert accounting.matrix_storage_bytes("uint6", 4096, 4096) == 4096 * 4096 * 3 // 4


def test_aliases_and_case():
    assert accounting.storage_format("BFloat16").name == "bf16"
    assert accounting.storage_format("half").name == "fp16"
    assert accounting.storage_format("W4").name == "int4"
    assert accounting.storage_format("packed6").name == "uint6"


def test_unknown_format_lists_known():
    with pytest.raises(InvalidValue) as err:
        accounting.storage_format("int3")
    assert "int3" in str(err.value) and "bf16" in str(err.value) and "uint6" in str(err.value)


def test_int4_matrix_matches_packed_w4_by_hand():
    # 4096 rows of 2048 code bytes + 128 scales x 4 bytes
    assert accounting.matrix_storage_bytes("int4", 4096, 4096) == 4096 * 2560
    # flat 33 elements: 17 code bytes + 2 started groups x 4 bytes
    assert accounting.storage_bytes("int4", 33) == 25


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 5000))
def test_int4_format_agrees_with_packed_w4_bytes(rows, width):
    assert accounting.matrix_storage_bytes("int4", rows, width) == accounting.packed_w4_bytes(rows, width)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["bf16", "fp16", "fp32", "fp8", "int8"]), st.integers(0, 10 ** 12), st.integers(1, 6))
def test_plain_formats_are_bits_over_eight_and_linear(name, elements, k):
    bits = EXPECTED[name][0]
    assert accounting.storage_bytes(name, elements) == elements * bits // 8
    assert accounting.storage_bytes(name, k * elements) == k * accounting.storage_bytes(name, elements)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_zero_elements_zero_bytes(name):
    assert accounting.storage_bytes(name, 0) == 0
    assert accounting.matrix_storage_bytes(name, 0, 64) == 0
    assert accounting.matrix_storage_bytes(name, 8, 0) == 0


def test_uint6_refuses_widths_it_cannot_pack():
    with pytest.raises(InvalidValue, match="multiple of 4"):
        accounting.matrix_storage_bytes("uint6", 2, 6)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_storage_bytes_refuses_bad_counts(bad):
    with pytest.raises(InvalidValue):
        accounting.storage_bytes("bf16", bad)


# ---------------------------------------------------------------------------
# the 6-bit codec
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("codes,packed", [
    ([1, 2, 3, 4], [1 | (2 & 3) << 6, (2 >> 2) | (3 & 15) << 4, (3 >> 4) | 4 << 2]),   # [129, 48, 16]
    ([63, 63, 63, 63], [255, 255, 255]),
    ([0, 63, 0, 0], [0b11000000, 0b00001111, 0]),
    ([0, 0, 63, 0], [0, 0b11110000, 0b00000011]),
    ([0, 0, 0, 63], [0, 0, 0b11111100]),
])
def test_pack_6bit_worked_groups(codes, packed):
    out = accounting.pack_6bit(torch.tensor([codes], dtype=torch.uint8))
    assert out.dtype == torch.uint8
    assert out.tolist() == [packed]


def _word_layout(codes):
    """The packed bytes by the 24-bit little-endian word each four codes make."""
    out = []
    for row in codes:
        packed = []
        for i in range(0, len(row), 4):
            c0, c1, c2, c3 = row[i:i + 4]
            word = c0 | c1 << 6 | c2 << 12 | c3 << 18
            packed += [word & 0xFF, (word >> 8) & 0xFF, word >> 16]
        out.append(packed)
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.data())
def test_every_code_round_trips_at_random_shapes(rows, groups, data):
    width = 4 * groups
    n = rows * width
    # every code 0..63 at least once where the tensor has room, the rest random
    values = [i % 64 for i in range(n)] if n >= 64 else data.draw(st.lists(st.integers(0, 63), min_size=n,
                                                                          max_size=n))
    values = data.draw(st.permutations(values))
    codes = torch.tensor(values, dtype=torch.uint8).reshape(rows, width)
    packed = accounting.pack_6bit(codes)
    assert tuple(packed.shape) == (rows, width * 3 // 4)
    assert packed.numel() == accounting.matrix_storage_bytes("uint6", rows, width)
    assert packed.tolist() == _word_layout(codes.tolist())
    back = accounting.unpack_6bit(packed, width)
    assert back.dtype == torch.uint8 and torch.equal(back, codes)


def test_all_64_codes_in_every_slot():
    # each code 0..63 in each of the four positions of a group
    codes = torch.stack([torch.arange(64, dtype=torch.uint8).roll(k) for k in range(4)], dim=1)  # [64, 4]
    packed = accounting.pack_6bit(codes)
    assert packed.tolist() == _word_layout(codes.tolist())
    assert torch.equal(accounting.unpack_6bit(packed, 4), codes)


def test_pack_6bit_errors():
    with pytest.raises(InvalidValue, match="divisible by 4"):
        accounting.pack_6bit(torch.zeros(2, 6, dtype=torch.uint8))
    with pytest.raises(InvalidValue, match="0..63"):
        accounting.pack_6bit(torch.tensor([[0, 64, 0, 0]], dtype=torch.uint8))
    with pytest.raises(InvalidValue, match="integer"):
        accounting.pack_6bit(torch.zeros(1, 4))
    with pytest.raises(InvalidValue, match="2-D"):
        accounting.pack_6bit(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(InvalidValue, match="divisible by 4"):
        accounting.unpack_6bit(torch.zeros(2, 3, dtype=torch.uint8), 5)
    with pytest.raises(InvalidValue, match="expected"):
        accounting.unpack_6bit(torch.zeros(2, 3, dtype=torch.uint8), 8)
    with pytest.raises(InvalidValue, match="uint8"):
        accounting.unpack_6bit(torch.zeros(2, 3, dtype=torch.int32), 4)


def test_pack_6bit_empty_rows():
    packed = accounting.pack_6bit(torch.zeros(0, 8, dtype=torch.uint8))
    assert tuple(packed.shape) == (0, 6)
    assert tuple(accounting.unpack_6bit(packed, 8).shape) == (0, 8)


def test_a_formats_aliases_are_its_own_so_a_third_partys_format_brings_them(monkeypatch):
    import types

    import ndcost
    from ndcost import manager
    from ndcost.plugins.storage import StorageFormat

    nf4 = StorageFormat(name="nf4", bits_per_element=4, group_size=64, scale_bytes=4, aliases=("NormalFloat4",))
    module = types.ModuleType("nf4_plugin")
    module.ndcost_register = ndcost.hookimpl(lambda register: register("storage/nf4", nf4))
    monkeypatch.setattr(manager, "_current", manager.load(extra_modules={"nf4": module}))
    assert accounting.storage_format("normalfloat4") is nf4
    assert accounting.storage_format("bfloat16").name == "bf16"   # the built-ins' aliases still hold
    assert accounting.storage_format("bf16").aliases == ("bfloat16",)
