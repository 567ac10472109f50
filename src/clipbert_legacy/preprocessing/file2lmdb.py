"""Store videos/images as raw bytes in an LMDB keyed by file stem (ClipBERT's file2lmdb CLI).

    python -m clipbert_legacy.preprocessing.file2lmdb --data_root DIR --lmdb_save_dir OUT --ext mp4 avi \
        --file_type video --num_workers 4 [--verify]
    python -m clipbert_legacy.preprocessing.file2lmdb --lmdb_save_dir OUT --file_type video --verify

With --fps/--short_side/--max_seconds/--crf each video is re-encoded first (video_compress: H.264,
yuv420p, even size), in --num_workers processes; --resume adds only the files whose key is missing.
A progress bar (plain lines when stderr is no terminal) shows the ETA; a summary lists videos, bytes
in/out and every failed file with its reason.

Fixes over ClipBERT: duplicate stems are refused (listed) instead of silently overwriting each
other; images keep their original bytes (no lossy JPEG re-encode); writes go in batched
transactions and the map size grows when full instead of reserving 1 TiB; counts and failed
files are reported; `--verify` re-opens every value and reports the undecodable ones.
"""
import argparse
import functools
import io
import json
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field

import lmdb

from clipbert_legacy.datasets.lmdb_store import LMDBStore, check_not_truncated
from clipbert_legacy.preprocessing.video_compress import CompressSettings, compress_video
from clipbert_legacy.utils.errors import DataStoreError

_INITIAL_MAP_SIZE = 64 * 1024 ** 2
SETTINGS_FILE = "file2lmdb_settings.json"


class Progress:
    """A tqdm bar with rate and ETA on a terminal; elsewhere (logs, launchers that prefix every
    line) one plain line every `interval` seconds, since carriage-return redraws pile up there."""

    def __init__(self, total, desc, enabled=True, log=print, interval=30.0, stream=sys.stderr):
        self.total, self.desc, self.log, self.interval = total, desc, log, interval
        self.n, self.start, self.last = 0, time.monotonic(), time.monotonic()
        self.bar = None
        self.enabled = enabled and total > 0
        if self.enabled and stream.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit="file", file=stream, smoothing=0.1)

    def line(self):
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.n / elapsed
        eta = (self.total - self.n) / rate if rate > 0 else float("inf")
        eta_s = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "?"
        return f"{self.desc}: {self.n}/{self.total} files, {rate:.2f} files/s, ETA {eta_s}"

    def update(self, k=1):
        self.n += k
        if self.bar is not None:
            self.bar.update(k)
        elif self.enabled and (time.monotonic() - self.last >= self.interval or self.n == self.total):
            self.last = time.monotonic()
            self.log(self.line())

    def close(self):
        if self.bar is not None:
            self.bar.close()


class LMDBWriter:
    """Put many key/value pairs with batched commits; doubles the map size on MapFullError."""

    def __init__(self, path, batch_bytes=256 * 1024 ** 2, batch_items=1000, map_size=_INITIAL_MAP_SIZE):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.env = lmdb.open(path, map_size=map_size, subdir=True, readonly=False,
                             meminit=False, map_async=True)
        self.batch_bytes, self.batch_items = batch_bytes, batch_items
        self._pending, self._pending_bytes = [], 0
        self.n_written = 0

    def put(self, key, value):
        if isinstance(key, str):
            key = key.encode("utf-8")
        self._pending.append((key, bytes(value)))
        self._pending_bytes += len(value)
        if len(self._pending) >= self.batch_items or self._pending_bytes >= self.batch_bytes:
            self.commit()

    def commit(self):
        if not self._pending:
            return
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for k, v in self._pending:
                        txn.put(k, v)
                break
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
        self.n_written += len(self._pending)
        self._pending, self._pending_bytes = [], 0

    def close(self):
        self.commit()
        self.env.sync()
        self.env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def collect_files(data_root, exts):
    """Recursively list files whose name ends with one of `exts` (ClipBERT: name.endswith(ext))."""
    exts = tuple(e if e.startswith(".") else "." + e for e in exts)
    paths = []
    for root, _, names in os.walk(data_root):
        paths.extend(os.path.join(root, n) for n in names if n.endswith(exts))
    return sorted(paths)


def file_stem(path):
    return os.path.splitext(os.path.basename(path))[0]


def find_duplicate_stems(paths):
    by_stem = defaultdict(list)
    for p in paths:
        by_stem[file_stem(p)].append(p)
    return {k: v for k, v in by_stem.items() if len(v) > 1}


def check_value(value, file_type):
    """None if `value` decodes as `file_type`, else a one-line reason."""
    if not value:
        return "0 bytes"
    try:
        if file_type == "video":
            from clipbert_legacy.datasets.decoder import open_container
            c = open_container(bytes(value))
            try:
                next(iter(c.decode(video=0)))
            finally:
                c.close()
        else:
            try:
                from PIL import Image
                with Image.open(io.BytesIO(value)) as im:
                    im.load()
            except ImportError:
                import av
                with av.open(io.BytesIO(value)) as c:
                    next(iter(c.decode(video=0)))
    except StopIteration:
        return "no decodable frame"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def _read(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return path, None, f"{type(e).__name__}: {e}"
    if not data:
        return path, None, "0 bytes"
    return path, data, None


def _read_and_compress(path, settings):
    """(path, value or None, input bytes, failure reason or None); runs in a worker process."""
    _, data, err = _read(path)
    if err:
        return path, None, 0, err
    try:
        return path, compress_video(data, settings), len(data), None
    except Exception as e:  # a bad input video is reported, never stored or silently dropped
        return path, None, len(data), f"{type(e).__name__}: {e}"


def _read_raw(path):
    path, data, err = _read(path)
    return path, data, len(data) if data else 0, err


@dataclass
class Summary:
    """What a build did: files found, skipped (already stored), written, failed [(path, reason)],
    and the bytes read from the written/failed inputs vs the bytes stored."""
    found: int = 0
    skipped: int = 0
    written: int = 0
    failed: list = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0

    def lines(self, file_type):
        ratio = f" ({self.bytes_out / self.bytes_in:.3f}x)" if self.bytes_in else ""
        return [f"{file_type} files: {self.found} found, {self.skipped} already stored (skipped), "
                f"{self.written} written, {len(self.failed)} failed",
                f"bytes in {_mb(self.bytes_in)} -> stored {_mb(self.bytes_out)}{ratio}"]


def _mb(n):
    return f"{n / 1024 ** 2:.1f} MB"


def _check_target(lmdb_save_dir, settings, resume):
    """Existing keys when resuming into a store made with the same settings; else the dir must be empty."""
    state = os.path.join(lmdb_save_dir, SETTINGS_FILE)
    has_store = os.path.isfile(os.path.join(lmdb_save_dir, "data.mdb"))
    if not resume:
        if os.path.isdir(lmdb_save_dir) and os.listdir(lmdb_save_dir):
            raise FileExistsError(f"--lmdb_save_dir {lmdb_save_dir} is not empty; choose a new directory "
                                  f"or pass --resume to add the missing files")
        return set()
    if not has_store:
        return set()
    old = {"compress": None}  # stores written before this file existed were raw bytes
    if os.path.isfile(state):
        with open(state) as f:
            old = json.load(f)
    if old.get("compress") != settings:
        raise ValueError(f"--resume: {lmdb_save_dir} was built with compression {old.get('compress')}, "
                         f"not {settings}; use the same options or a new directory")
    env = lmdb.open(lmdb_save_dir, readonly=True, lock=False, subdir=True)  # closed before writing
    try:
        check_not_truncated(env, lmdb_save_dir)
        with env.begin() as txn:
            return {k.decode("utf-8") for k in txn.cursor().iternext(keys=True, values=False)}
    finally:
        env.close()


def _collect(data_root, exts):
    paths = collect_files(data_root, exts)
    if not paths:
        raise FileNotFoundError(f"no files ending with {exts} under --data_root {data_root}")
    dups = find_duplicate_stems(paths)
    if dups:
        lines = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(dups.items())[:20])
        raise ValueError(f"{len(dups)} file stems occur more than once (the LMDB key is the stem, so they "
                         f"would overwrite each other); rename them: {lines}")
    return paths


def _pool(compress, num_workers):
    if compress is None:  # raw bytes: I/O bound, threads suffice
        return ThreadPoolExecutor(max(1, num_workers)), _read_raw
    return ProcessPoolExecutor(max(1, num_workers)), functools.partial(_read_and_compress, settings=compress)


def build_lmdb_summary(data_root, lmdb_save_dir, exts, file_type="video", num_workers=4, compress=None,
                       resume=False, progress=True, log=print):
    """Write every matching file into the LMDB (re-encoded by `compress`, a CompressSettings, if given).
    With `resume`, keys already in the store are skipped. Returns a Summary."""
    if compress is not None and file_type != "video":
        raise ValueError("--fps/--short_side/--max_seconds/--crf re-encode videos; not for --file_type image")
    settings = compress.as_dict() if compress is not None else None
    paths = _collect(data_root, exts)
    existing = _check_target(lmdb_save_dir, settings, resume)
    todo = [p for p in paths if file_stem(p) not in existing]
    summary = Summary(found=len(paths), skipped=len(paths) - len(todo))
    os.makedirs(lmdb_save_dir, exist_ok=True)
    with open(os.path.join(lmdb_save_dir, SETTINGS_FILE), "w") as f:
        json.dump({"file_type": file_type, "compress": settings}, f)
    pool, fn = _pool(compress, num_workers)
    bar = Progress(len(todo), "file2lmdb", enabled=progress, log=log)
    with LMDBWriter(lmdb_save_dir) as writer, pool:
        for path, value, n_in, err in pool.map(fn, todo):
            summary.bytes_in += n_in
            if err:
                summary.failed.append((path, err))
            else:
                writer.put(file_stem(path), value)
                summary.written += 1
                summary.bytes_out += len(value)
            bar.update(1)
    bar.close()
    if summary.failed:
        with open(os.path.join(lmdb_save_dir, "error_filepaths.log"), "w") as f:
            f.writelines(f"{p}\t{r}\n" for p, r in summary.failed)
    return summary


def build_lmdb(data_root, lmdb_save_dir, exts, file_type="video", num_workers=4, log=print, **kw):
    """build_lmdb_summary returning (n_written, [(path, reason)] failed) (ClipBERT-era callers)."""
    s = build_lmdb_summary(data_root, lmdb_save_dir, exts, file_type, num_workers, log=log, **kw)
    return s.written, s.failed


def verify_lmdb(lmdb_save_dir, file_type="video", num_workers=4):
    """Re-open every value; returns (n_checked, [(key, reason)] undecodable)."""
    with LMDBStore(lmdb_save_dir)._open().begin() as txn:  # shared per-process env
        items = [(k.decode("utf-8"), v) for k, v in txn.cursor()]
    with ThreadPoolExecutor(max(1, num_workers)) as pool:
        reasons = list(pool.map(lambda kv: check_value(kv[1], file_type), items))
    bad = [(k, r) for (k, _), r in zip(items, reasons) if r is not None]
    return len(items), bad


def _parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_root", help="folder searched recursively for input files")
    p.add_argument("--lmdb_save_dir", required=True, help="new (empty) LMDB directory")
    p.add_argument("--ext", nargs="+", default=["mp4"], help="file name endings, e.g. mp4 avi")
    p.add_argument("--file_type", choices=["video", "image"], default="video")
    p.add_argument("--num_workers", type=int, default=4, help="parallel readers / encoder processes")
    p.add_argument("--verify", action="store_true", help="decode-check every stored value")
    p.add_argument("--resume", action="store_true", help="add to an existing store, skipping stored keys")
    p.add_argument("--no_progress", action="store_true", help="no progress bar / progress lines")
    g = p.add_argument_group("re-encoding (any of these re-encodes each video with libx264 before storing)")
    g.add_argument("--fps", type=float, help="keep at most this many frames per second")
    g.add_argument("--short_side", type=int, help="downscale so the shorter side is at most this")
    g.add_argument("--max_seconds", type=float, help="keep only the first seconds of each video")
    g.add_argument("--crf", type=int, help="x264 quality, 0-51, lower is better (default 23)")
    return p


def _compress_settings(args, p):
    if all(v is None for v in (args.fps, args.short_side, args.max_seconds, args.crf)):
        return None
    for name in ("fps", "short_side", "max_seconds"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            p.error(f"--{name} must be > 0, got {v}")
    if args.crf is not None and not 0 <= args.crf <= 51:
        p.error(f"--crf must be in 0..51, got {args.crf}")
    return CompressSettings(args.fps, args.short_side, args.max_seconds,
                            23 if args.crf is None else args.crf)


def _build(args, compress):
    try:
        s = build_lmdb_summary(args.data_root, args.lmdb_save_dir, args.ext, args.file_type,
                               args.num_workers, compress=compress, resume=args.resume,
                               progress=not args.no_progress)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {s.written} {args.file_type} files to {args.lmdb_save_dir}; {len(s.failed)} failed")
    for line in s.lines(args.file_type):
        print(line)
    for path, reason in s.failed:
        print(f"failed: {path}: {reason}")
    return 1 if s.failed else 0


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    compress = _compress_settings(args, p)
    rc = 0
    if args.data_root:
        rc = _build(args, compress)
        if rc == 2:
            return rc
    elif not args.verify:
        p.error("give --data_root to build a store, or --verify to check an existing one")
    if args.verify:
        try:
            n, bad = verify_lmdb(args.lmdb_save_dir, args.file_type, args.num_workers)
        except (DataStoreError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"verified {n} values in {args.lmdb_save_dir}; {len(bad)} undecodable")
        for key, reason in bad:
            print(f"undecodable: {key}: {reason}")
        rc = rc or (1 if bad else 0)
    return rc


if __name__ == "__main__":
    sys.exit(main())
