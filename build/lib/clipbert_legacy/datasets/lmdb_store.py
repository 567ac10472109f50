"""Read-only LMDB of raw video/image bytes, opened lazily in each process.

ClipBERT opened the environment in the Dataset constructor, i.e. before DataLoader workers
fork, and turned a missing key into an empty stream. Here the environment is opened on first
use in the current process (re-opened after a fork, dropped when pickled) and a missing key
raises KeyError naming the store and the key.
"""
import os

import lmdb

from clipbert_legacy.utils.errors import DataStoreError

_ENVS = {}  # (realpath, pid) -> lmdb.Environment; LMDB allows one open env per path per process


def check_not_truncated(env, path):
    """Raise :class:`DataStoreError` if ``data.mdb`` is shorter than the pages its last transaction
    uses. An interrupted copy of a store opens fine (the meta pages are at the start) and then kills
    the process with SIGBUS at the first read past the end of the file: no message, exit 135."""
    data = os.path.join(path, "data.mdb")
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    size = os.path.getsize(data)
    if size < need:
        raise DataStoreError(f"LMDB store {path} is truncated: {data} has {size:,} bytes, its pages end at "
                             f"{need:,} (an interrupted copy?); copy the store again, or rebuild it with "
                             f"python -m clipbert_legacy.preprocessing.file2lmdb")


class LMDBStore:
    """`store.get(key) -> bytes`; `key in store`; `len(store)`; `store.keys()`."""

    def __init__(self, path):
        if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "data.mdb")):
            raise FileNotFoundError(f"LMDB store {path} not found (no data.mdb); build it with "
                                    f"python -m clipbert_legacy.preprocessing.file2lmdb")
        self.path = path
        self._env, self._pid = None, None
        self._check_early()

    def _check_early(self):
        """A truncated store fails here, in the main process, not in a DataLoader worker at its first
        read; the environment is closed again (opened lazily per process, after the workers fork)."""
        if (os.path.realpath(self.path), os.getpid()) in _ENVS:  # open and checked already
            return
        try:
            env = lmdb.open(self.path, readonly=True, create=False, lock=False, readahead=False, subdir=True)
        except lmdb.Error as e:
            raise self._error("cannot be opened (not an LMDB store, or cut short)", e) from e
        try:
            check_not_truncated(env, self.path)
        finally:
            env.close()

    def _open(self):
        pid = os.getpid()
        if self._env is None or self._pid != pid:
            real = os.path.realpath(self.path)
            key = (real, pid)
            for old in [k for k in _ENVS if k[0] == real and k[1] != pid]:
                _ENVS.pop(old).close()  # inherited through fork: unusable here, and blocks re-opening
            if key not in _ENVS:
                try:
                    env = lmdb.open(self.path, readonly=True, create=False, lock=False,
                                    readahead=False, max_readers=512, subdir=True)
                except lmdb.Error as e:
                    raise self._error("cannot be opened (not an LMDB store, or cut short)", e) from e
                try:
                    check_not_truncated(env, self.path)  # the file may have changed since __init__
                except DataStoreError:
                    env.close()
                    raise
                _ENVS[key] = env
            self._env, self._pid = _ENVS[key], pid
        return self._env

    def _error(self, what, e):
        return DataStoreError(f"LMDB store {self.path} {what} ({type(e).__name__}: {e}); rebuild it with "
                              f"python -m clipbert_legacy.preprocessing.file2lmdb")

    def get(self, key):
        try:
            with self._open().begin(buffers=False) as txn:
                value = txn.get(str(key).encode("utf-8"))
        except lmdb.Error as e:
            raise self._error(f"cannot be read at key {key!r}", e) from e
        if value is None:
            raise KeyError(f"key {key!r} not in LMDB store {self.path}; check that the jsonl video "
                           f"name matches the file stem used by file2lmdb")
        return value

    def __contains__(self, key):
        with self._open().begin(buffers=True) as txn:
            return txn.get(str(key).encode("utf-8")) is not None

    def __len__(self):
        return self._open().stat()["entries"]

    def keys(self):
        with self._open().begin() as txn:
            return [k.decode("utf-8") for k in txn.cursor().iternext(keys=True, values=False)]

    def __getstate__(self):
        return {"path": self.path, "_env": None, "_pid": None}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self):
        return f"LMDBStore({self.path!r})"
