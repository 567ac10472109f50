"""What an mp4's sample tables claim, checked against the file's size before FFmpeg reads them.

FFmpeg's mov demuxer builds its index when the container is opened, from counts in the ``moov`` box: a
``stsz`` box with one fixed sample size says "50,000,000 samples" in 20 bytes, and FFmpeg allocates an
index entry per sample (with ``ctts``, more) before any check: a 6.4 KB file cost ~2 GB per decoding
process and then passed as a good video. A sample of a real file occupies at least one byte of it, and
a table's entries are bytes of its box; so a track whose ``stsz``/``stz2`` count, ``stts``/``ctts`` sums
or fragment (``trun``) counts exceed the file's size, or a table whose entry count exceeds what its box
holds, is refused here (:func:`check_sample_tables`) in one pass over the box headers, costing
microseconds and no allocation beyond the boxes' headers.
"""
from __future__ import annotations

import numpy as np

_MAX_DEPTH = 10  # FFmpeg's mov demuxer reads boxes nested at most this deep too
_NESTED = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"moof", b"traf", b"mvex", b"edts"}
# full box with an entry count after version/flags -> bytes per entry (at least)
_TABLES = {b"stts": 8, b"ctts": 8, b"stsc": 12, b"stco": 4, b"co64": 8, b"stss": 4, b"stps": 4, b"elst": 12}
_SUMMED = (b"stts", b"ctts")


class ImplausibleIndex(ValueError):
    """The sample tables claim more than the file can hold; str() names the box and the numbers."""


def _u32(buf, pos: int) -> int:
    return int.from_bytes(buf[pos:pos + 4], "big")


def _boxes(buf, start: int, end: int):
    """(type, payload start, box end) of the boxes in ``buf[start:end]``; a box that claims to run past
    ``end`` is cut there (FFmpeg reads what is there)."""
    pos = start
    while pos + 8 <= end:
        size, kind, head = _u32(buf, pos), bytes(buf[pos + 4:pos + 8]), 8
        if size == 1:
            if pos + 16 > end:
                return
            size, head = int.from_bytes(buf[pos + 8:pos + 16], "big"), 16
        elif size == 0:
            size = end - pos
        if size < head:
            return
        box_end = min(pos + size, end)
        yield kind, pos + head, box_end
        pos = box_end


def _table_entries(buf, kind: bytes, start: int, end: int) -> int:
    """The entry count a full box of ``kind`` declares; ImplausibleIndex when its box cannot hold them."""
    if end - start < 8:
        return 0
    count = _u32(buf, start + 4)
    size = _TABLES[kind]
    if count * size > end - start - 8:
        raise ImplausibleIndex(f"its {kind.decode()} box declares {count} entries of {size} bytes in "
                               f"{end - start - 8} bytes")
    return count


def _track_samples(buf, start: int, end: int, file_size: int) -> int:
    """The largest sample count the tables of one ``trak`` (or ``traf``) claim."""
    claims = [0]
    for kind, s, e in _walk(buf, start, end):
        if kind in (b"stsz", b"stz2") and e - s >= 12:
            count = _u32(buf, s + 8)
            fixed = _u32(buf, s + 4) if kind == b"stsz" else 0
            bits = buf[s + 7] if kind == b"stz2" else 32
            if not fixed and count * max(bits, 4) // 8 > e - s - 12:
                raise ImplausibleIndex(f"its {kind.decode()} box declares {count} sample sizes in "
                                       f"{e - s - 12} bytes")
            if fixed and count * fixed > file_size:
                raise ImplausibleIndex(f"its stsz box claims {count} samples of {fixed} bytes "
                                       f"({count * fixed} bytes) in a file of {file_size}")
            claims.append(count)
        elif kind in _SUMMED:
            n = _table_entries(buf, kind, s, e)
            counts = np.frombuffer(buf, dtype=">u4", count=2 * n, offset=s + 8)[0::2]
            claims.append(int(counts.sum(dtype=np.uint64)))
        elif kind in _TABLES:
            _table_entries(buf, kind, s, e)
        elif kind == b"trun" and e - s >= 8:
            claims.append(_u32(buf, s + 4))
    return max(claims)


def _walk(buf, start: int, end: int, depth: int = 0):
    for kind, s, e in _boxes(buf, start, end):
        yield kind, s, e
        if kind in _NESTED and depth < _MAX_DEPTH:
            yield from _walk(buf, s, e, depth + 1)


def check_sample_tables(buf) -> None:
    """Raise :class:`ImplausibleIndex` when an ISO BMFF file (``buf``: bytes-like) claims, in any track,
    more samples than it has bytes, or a table longer than its box."""
    size = len(buf)
    fragments = 0
    for kind, s, e in _boxes(buf, 0, size):
        if kind not in (b"moov", b"moof"):
            continue
        for sub, ss, se in _boxes(buf, s, e):
            if sub not in (b"trak", b"traf"):
                continue
            n = _track_samples(buf, ss, se, size)
            if sub == b"traf":
                fragments += n
            if n > size or fragments > size:
                raise ImplausibleIndex(f"a track claims {max(n, fragments)} samples in a file of {size} "
                                       f"bytes (each sample takes at least one byte)")
