"""Reading raw annotation files with `file:line` errors, and writing this project's jsonl files.

Every reader returns (where, row) pairs, `where` being "path:line", so a converter can name the exact
line of a bad row in a one-line ValueError (the CLI prints it as `error: ...` and exits 1).
"""
import csv
import json
import os
import re
from collections import Counter

import ujson


def _open(path):
    if not os.path.isfile(path):
        raise ValueError(f"{path}: file not found")
    return open(path, encoding="utf-8-sig", newline="")  # -sig: tolerate a BOM from spreadsheet tools


def read_table(path, required, delimiter):
    """Rows of a delimited file with a header line, as (path:line, {column: value}).

    Tab-separated files (TGIF-QA, MSR_MC_test.csv) are read without quote handling, since their
    questions contain bare double quotes; comma-separated ones (the MSRVTT split lists) with it.
    """
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    with _open(path) as f:
        reader = csv.reader(f, delimiter=delimiter, quoting=quoting)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}:1: empty file; expected a header line")
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise ValueError(f"{path}:1: header lacks column(s) {missing}; found {header}")
        rows = []
        for fields in reader:
            where = f"{path}:{reader.line_num}"
            if not any(x.strip() for x in fields):
                continue
            if len(fields) != len(header):
                raise ValueError(f"{where}: {len(fields)} fields, the header has {len(header)} "
                                 f"({'tab' if delimiter == chr(9) else 'comma'}-separated)")
            rows.append((where, dict(zip(header, fields))))
    return rows


def _skip_ws(text, pos):
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _array_items(text, pos, path):
    """(line, item) for each element of the JSON array starting at text[pos] == '['."""
    dec, out, line, last = json.JSONDecoder(), [], 1, 0
    pos = _skip_ws(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        line += text.count("\n", last, pos)
        last = pos
        item, end = dec.raw_decode(text, pos)
        out.append((f"{path}:{line}", item))
        pos = _skip_ws(text, end)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
    return out


def read_json_items(path, key=None):
    """Items of a JSON array (the whole file, or the top-level object's `key`), each with path:line."""
    with _open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except ValueError as e:
        line = getattr(e, "lineno", "?")
        raise ValueError(f"{path}:{line}: invalid JSON ({e})") from None
    arr = data if key is None else (data.get(key) if isinstance(data, dict) else None)
    if not isinstance(arr, list):
        want = "a JSON list" if key is None else f"an object with a {key!r} list"
        raise ValueError(f"{path}:1: expected {want}, got {type(data).__name__}")
    if key is None:
        start = _skip_ws(text, 0)
    else:  # the key's array: check it is the one found, else fall back to item indices
        m = re.search('"' + re.escape(key) + r'"\s*:\s*\[', text)
        start = m.end() - 1 if m else None
    if start is not None:
        items = _array_items(text, start, path)
        if [it for _, it in items] == arr:
            return items
    return [(f"{path}:{key}[{i}]", it) for i, it in enumerate(arr)]


def need(row, where, fields):
    """Fail naming the line when a row lacks fields (or it is not an object at all)."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
    missing = [k for k in fields if k not in row or row[k] is None]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}; present: {sorted(row)}")


def text_of(row, key, where):
    """The stripped non-empty string `row[key]` (captions/questions/answers go to the tokenizer)."""
    v = row.get(key)
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{where}: field {key!r} must be a non-empty string, got {ujson.dumps(v)}")
    return v.strip()


def int_of(value, where, name, lo, hi):
    """int(value) within [lo, hi]; numeric strings (CSV fields) accepted."""
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{where}: {name} must be an integer {lo}..{hi}, got {value!r}") from None
    if not lo <= n <= hi:
        raise ValueError(f"{where}: {name} must be in {lo}..{hi}, got {n}")
    return n


def check_unique(pairs, what):
    """pairs: (where, id). Fails on the second occurrence of an id, naming both lines."""
    seen = {}
    for where, ident in pairs:
        if ident in seen:
            raise ValueError(f"{where}: duplicate {what} {ident!r} (first at {seen[ident]})")
        seen[ident] = where


def answer_vocab(answers, top_k):
    """ClipBERT's rule: the `top_k` most frequent training answers -> labels 0..k-1, most frequent
    first; equal counts keep the order of first occurrence (Counter.most_common is stable)."""
    if top_k < 1:
        raise ValueError(f"answer vocabulary size must be >= 1, got {top_k}")
    return {a: i for i, (a, _) in enumerate(Counter(answers).most_common(top_k))}


def write_jsonl(path, rows):
    """UTF-8 jsonl, non-ASCII kept as is (ujson, like the loader). Returns the row count."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(ujson.dumps(r, ensure_ascii=False, escape_forward_slashes=False) + "\n")
    return len(rows)


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=0)
        f.write("\n")
