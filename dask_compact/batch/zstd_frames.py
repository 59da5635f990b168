"""The zstd frame format (RFC 8878), read on the CPU: what a frame header declares, and where
the frames of a buffer holding several begin and end.

A zarr chunk written by zstd is usually one frame, but any number of frames concatenated is
valid zstd (RFC 8878, 3.1: every zstd reader decodes them as one stream), and the GPU writer
of the batch job cuts its chunks into several frames (:func:`.gpu_zstd.encode`: nvCOMP
encodes a batch of small frames far sooner than a few large ones). nvCOMP's decoder takes one
frame per request and trusts what it is given, so a chunk is split here first, with every
size checked against the buffer.
"""

from __future__ import annotations

from typing import NamedTuple

MAGIC = b"\x28\xb5\x2f\xfd"
_SKIPPABLE = 0x184D2A50  # skippable frames: magic 0x184D2A5?, a 4-byte size, that many bytes
_BLOCK_MAX = 128 << 10  # a block's content is at most 128 KiB (RFC 8878, 3.1.1.2.4)


class Frame(NamedTuple):
    offset: int  # where the frame begins in the buffer
    length: int  # its bytes, header, blocks and checksum
    content: int | None  # the decompressed bytes its header declares, None if it declares none


def declared_total(frames: list[Frame] | None) -> int | None:
    """The decompressed bytes ``frames`` declare in all, or None where there are none or one
    of them declares nothing."""
    if not frames or any(f.content is None for f in frames):
        return None
    return sum(f.content or 0 for f in frames)


def content_size(frame: bytes | memoryview) -> int | None:
    """The decompressed size a zstd frame header declares (RFC 8878, 3.1.1.1), or None when
    the header declares none or is not a zstd frame header."""
    parsed = _header(bytes(frame[:18]))
    return None if parsed is None else parsed[1]


def _header(b: bytes) -> tuple[int, int | None, bool] | None:
    """(header bytes, declared content size or None, checksum follows) of the frame header
    at the start of ``b``, or None where ``b`` does not start with one."""
    if len(b) < 5 or b[:4] != MAGIC:
        return None
    fhd = b[4]
    fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
    if fhd & 0x08:  # the reserved bit must be zero
        return None
    dict_size = (0, 1, 2, 4)[fhd & 3]
    at = 5 + (0 if single else 1) + dict_size
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if len(b) < at + size:
        return None
    if size == 0:
        return at, None, bool(fhd & 0x04)
    value = int.from_bytes(b[at : at + size], "little")
    return at + size, value + 256 if size == 2 else value, bool(fhd & 0x04)


def split(buf: bytes | memoryview) -> list[Frame] | None:
    """The zstd frames of ``buf``, in order (skippable frames left out), or None where ``buf``
    is not a sequence of whole zstd frames (a header, a block type or a size that does not
    fit). Walks the blocks' 3-byte headers, not their content: a frame's bytes are checked
    for length only, as a decoder finds them."""
    view = memoryview(buf)
    n = len(view)
    frames: list[Frame] = []
    at = 0
    while at < n:
        if n - at >= 8 and int.from_bytes(view[at : at + 4], "little") & ~0xF == _SKIPPABLE:
            at += 8 + int.from_bytes(view[at + 4 : at + 8], "little")
            if at > n:
                return None
            continue
        parsed = _header(bytes(view[at : at + 18]))
        if parsed is None:
            return None
        head, declared, checksum = parsed
        pos = at + head
        while True:
            if pos + 3 > n:
                return None
            bh = int.from_bytes(view[pos : pos + 3], "little")
            last, kind, size = bh & 1, (bh >> 1) & 3, bh >> 3
            if kind == 3 or size > _BLOCK_MAX:
                return None
            pos += 3 + (1 if kind == 1 else size)  # an RLE block stores its one byte
            if last:
                break
        pos += 4 if checksum else 0
        if pos > n:
            return None
        frames.append(Frame(at, pos - at, declared))
        at = pos
    return frames
