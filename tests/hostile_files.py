"""Builders of the hostile files of issue 49 (tests/test_hostile_inputs.py): each is small, and each would
cost a trusting loader gigabytes or forever."""
from __future__ import annotations

import io
import pickle
import struct
import zipfile
from fractions import Fraction

import av
import numpy as np
import torch


def shared_tuple(levels: int = 40):
    """``t_k = (t_{k-1}, t_{k-1})``: pickle's memo writes each level once (a few bytes), a walk that does not
    remember what it saw visits 2**levels paths."""
    t = ()
    for _ in range(levels):
        t = (t, t)
    return t


def write_shared_pkl(path) -> None:
    """The 237-byte ``.pkl`` of the issue: ``{"model": {"w": t40}}``."""
    with open(path, "wb") as f:
        f.write(pickle.dumps({"model": {"w": shared_tuple()}}, protocol=2))


def write_shared_restore(path) -> None:
    """The 1.4 KB ``restore.pt`` of the issue: a restore state with ``t40`` in it."""
    torch.save({"global_step": 1, "finished": False, "hooks": {"x": shared_tuple()}}, path)


def write_deflated_archive(path, numel: int, corrupt_extra: bool = True) -> None:
    """A torch archive whose tensor record of ``numel`` float32 zeros is deflated (``torch.save`` never
    compresses; torch's reader inflates it in memory), each central-directory entry with a malformed extra
    field that Python's ``zipfile`` refuses (``BadZipFile``) and torch's reader ignores."""
    buf = io.BytesIO()
    torch.save({"global_step": 1, "w": torch.zeros(77)}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(path, "w", compresslevel=1) as z:
        for info in src.infolist():
            data = src.read(info.filename)
            zi = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            zi.compress_type = zipfile.ZIP_DEFLATED
            # the level ZipFile(compresslevel=1) gives only to entries it names itself (a ZipInfo passed to
            # open() keeps zlib's default, 6: 30 s of CPU for the 3 GB record instead of 7); public from 3.13
            setattr(zi, "compress_level" if hasattr(zi, "compress_level") else "_compresslevel", 1)
            if corrupt_extra:
                zi.extra = b"\x34\x12\x10\x00"  # header 0x1234 claiming 16 bytes that are not there
            if info.filename.endswith("data.pkl"):  # 77 elements -> numel, in the storage and the size
                data = data.replace(b"K\x4d", b"J" + struct.pack("<i", numel))
                z.writestr(zi, data)
            elif info.filename.endswith("/data/0"):
                with z.open(zi, "w", force_zip64=True) as f:
                    chunk = bytes(2 ** 24)
                    for _ in range(numel * 4 // len(chunk)):
                        f.write(chunk)
            else:
                z.writestr(zi, data)


def c_memo_pickle() -> bytes:
    """One ``LONG_BINPUT`` to index 2**31 - 1: the C unpickler grows its memo array to it (16 GB)."""
    return b"\x80\x02N" + b"r" + struct.pack("<I", 2 ** 31 - 1) + b"."


def build_on_function_pickle() -> bytes:
    """BUILD of ``{"__name__": ..., "__defaults__": ...}`` onto the loader's own ``numpy...scalar``."""
    return (b"\x80\x02cnumpy.core.multiarray\nscalar\nq\x00}q\x01(X\x08\x00\x00\x00__name__q\x02X\x05\x00\x00"
            b"\x00ownedq\x03ub.")


def _patch_box(data: bytearray, kind: bytes, patch) -> None:
    """Apply ``patch(data, payload_start)`` to the first box of ``kind`` (found by its type bytes)."""
    at = data.find(kind)
    assert at >= 4, kind
    patch(data, at + 4)


def mp4_claiming_frames(mp4: bytes, frames: int = 50_000_000) -> bytes:
    """``mp4`` with its video ``stsz`` rewritten to one fixed sample size and ``frames`` samples: FFmpeg
    allocates an index entry per claimed sample when it opens the file."""
    data = bytearray(mp4)

    def patch(d, p):
        struct.pack_into(">II", d, p + 4, 1, frames)  # sample_size 1 (fixed), sample_count
    _patch_box(data, b"stsz", patch)
    return bytes(data)


def _annexb(size: int, n: int) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="h264") as c:
        s = c.add_stream("libx264", rate=30)
        s.width = s.height = size
        s.pix_fmt = "yuv420p"
        s.options = {"threads": "1", "x264-params": "asm=0"}
        for i in range(n):
            img = np.full((size, size, 3), i * 20, np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def mp4_with_inband_size_change(small: int = 64, big: int = 128, n_small: int = 1, n_big: int = 9,
                                fmt: str = "mp4") -> bytes:
    """A video (``fmt``: an ffmpeg muxer, mp4 or matroska) whose header (and first ``n_small`` frames)
    say ``small`` x ``small`` and whose later frames, after an in-band SPS, are ``big`` x ``big``."""
    src = av.open(io.BytesIO(_annexb(small, n_small) + _annexb(big, n_big)))
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as muxer:
        st = muxer.add_stream_from_template(src.streams.video[0])
        for i, p in enumerate(q for q in src.demux(video=0) if q.size):
            p.stream, p.time_base, p.pts, p.dts = st, Fraction(1, 1000), i * 33, i * 33
            muxer.mux(p)
    return out.getvalue()
