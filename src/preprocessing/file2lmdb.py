"""Store videos/images as raw bytes in an LMDB keyed by file stem (ClipBERT's file2lmdb CLI).

    python -m src.preprocessing.file2lmdb --data_root DIR --lmdb_save_dir OUT --ext mp4 avi \
        --file_type video --num_workers 4 [--verify]
    python -m src.preprocessing.file2lmdb --lmdb_save_dir OUT --file_type video --verify

Fixes over ClipBERT: duplicate stems are refused (listed) instead of silently overwriting each
other; images keep their original bytes (no lossy JPEG re-encode); writes go in batched
transactions and the map size grows when full instead of reserving 1 TiB; counts and failed
files are reported; `--verify` re-opens every value and reports the undecodable ones.
"""
import argparse
import io
import os
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import lmdb

_INITIAL_MAP_SIZE = 64 * 1024 ** 2


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
            from src.datasets.decoder import open_container
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


def build_lmdb(data_root, lmdb_save_dir, exts, file_type="video", num_workers=4, log=print):
    """Write every matching file into a new LMDB. Returns (n_written, [(path, reason)] failed)."""
    if os.path.isdir(lmdb_save_dir) and os.listdir(lmdb_save_dir):
        raise FileExistsError(f"--lmdb_save_dir {lmdb_save_dir} is not empty; choose a new directory")
    paths = collect_files(data_root, exts)
    if not paths:
        raise FileNotFoundError(f"no files ending with {exts} under --data_root {data_root}")
    dups = find_duplicate_stems(paths)
    if dups:
        lines = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(dups.items())[:20])
        raise ValueError(f"{len(dups)} file stems occur more than once (the LMDB key is the stem, so they "
                         f"would overwrite each other); rename them: {lines}")
    failed = []
    with LMDBWriter(lmdb_save_dir) as writer, ThreadPoolExecutor(max(1, num_workers)) as pool:
        for i, (path, data, err) in enumerate(pool.map(_read, paths)):
            if err:
                failed.append((path, err))
                continue
            writer.put(file_stem(path), data)
            if (i + 1) % 1000 == 0:
                log(f"{i + 1}/{len(paths)} files read")
        n = writer.n_written + len(writer._pending)
    if failed:
        with open(os.path.join(lmdb_save_dir, "error_filepaths.log"), "w") as f:
            f.writelines(f"{p}\t{r}\n" for p, r in failed)
    return n, failed


def verify_lmdb(lmdb_save_dir, file_type="video", num_workers=4):
    """Re-open every value; returns (n_checked, [(key, reason)] undecodable)."""
    from src.datasets.lmdb_store import LMDBStore
    with LMDBStore(lmdb_save_dir)._open().begin() as txn:  # shared per-process env
        items = [(k.decode("utf-8"), v) for k, v in txn.cursor()]
    with ThreadPoolExecutor(max(1, num_workers)) as pool:
        reasons = list(pool.map(lambda kv: check_value(kv[1], file_type), items))
    bad = [(k, r) for (k, _), r in zip(items, reasons) if r is not None]
    return len(items), bad


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_root", help="folder searched recursively for input files")
    p.add_argument("--lmdb_save_dir", required=True, help="new (empty) LMDB directory")
    p.add_argument("--ext", nargs="+", default=["mp4"], help="file name endings, e.g. mp4 avi")
    p.add_argument("--file_type", choices=["video", "image"], default="video")
    p.add_argument("--num_workers", type=int, default=4)
    p.add_argument("--verify", action="store_true", help="decode-check every stored value")
    args = p.parse_args(argv)
    rc = 0
    if args.data_root:
        try:
            n, failed = build_lmdb(args.data_root, args.lmdb_save_dir, args.ext, args.file_type,
                                   args.num_workers)
        except (ValueError, FileExistsError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {n} {args.file_type} files to {args.lmdb_save_dir}; {len(failed)} failed")
        for path, reason in failed:
            print(f"failed: {path}: {reason}")
        rc = 1 if failed else 0
    elif not args.verify:
        p.error("give --data_root to build a store, or --verify to check an existing one")
    if args.verify:
        n, bad = verify_lmdb(args.lmdb_save_dir, args.file_type, args.num_workers)
        print(f"verified {n} values in {args.lmdb_save_dir}; {len(bad)} undecodable")
        for key, reason in bad:
            print(f"undecodable: {key}: {reason}")
        rc = rc or (1 if bad else 0)
    return rc


if __name__ == "__main__":
    sys.exit(main())
