"""Reading raw annotation files with precise error locations, and writing a converter's files all or none.

Every reader returns (where, row) pairs, `where` being "path:line" for tables and "path: key[i] (id
...)" for JSON items (the releases' JSON files are single lines), so a converter names the exact row
of a bad entry in a one-line ValueError (the CLI prints it as `error: ...` and exits 1).
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

    Read as the releases' own code reads them (``pandas.read_csv``, default quoting): a field that
    starts with a double quote is quoted, a doubled quote in it is one quote character, a quote inside an
    unquoted field is kept as text; CRLF line ends are accepted. Columns are selected by header name.
    """
    with _open(path) as f:
        reader = csv.reader(f, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL, doublequote=True,
                            strict=False)
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


def _array_lines(text, pos):
    """(line, element) for each element of the JSON array starting at text[pos] == '['."""
    dec, out, line, last = json.JSONDecoder(), [], 1, 0
    pos = _skip_ws(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        line += text.count("\n", last, pos)
        last = pos
        item, end = dec.raw_decode(text, pos)
        out.append((line, item))
        pos = _skip_ws(text, end)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
    return out


def _item_where(path, line, label, i, item, id_keys):
    """``path:line: label[i] (id_key 'x')``; no line for single-line files (every item is on line 1)."""
    where = f"{path}:{line}: {label}[{i}]" if line else f"{path}: {label}[{i}]"
    if isinstance(item, dict):
        for k in id_keys:
            if item.get(k) is not None:
                return f"{where} ({k} {item[k]!r})"
    return where


def read_json_items(path, key=None, id_keys=()):
    """Items of a JSON array (the whole file, or the top-level object's ``key``), each with where it
    is: ``path:line: key[i] (id ...)``; the public releases are single-line files, so the item index
    and its first present ``id_keys`` field name it there."""
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
    lines = [None] * len(arr)
    if "\n" in text.strip():
        if key is None:
            start = _skip_ws(text, 0)
        else:  # the first '"key": [' in the text: used only when it holds exactly the items found
            m = re.search('"' + re.escape(key) + r'"\s*:\s*\[', text)
            start = m.end() - 1 if m else None
        if start is not None:
            try:
                found = _array_lines(text, start)
            except ValueError:
                found = []
            if [it for _, it in found] == arr:
                lines = [line for line, _ in found]
    label = key or "item"
    return [(_item_where(path, ln, label, i, it, id_keys), it) for i, (ln, it) in enumerate(zip(lines, arr))]


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


def in_vocab(rows, ans2label):
    """(rows whose ``answer`` is in ``ans2label``, how many were left out)."""
    kept = [r for r in rows if r["answer"] in ans2label]
    return kept, len(rows) - len(kept)


def _jsonl_text(rows):
    return "".join(ujson.dumps(r, ensure_ascii=False, escape_forward_slashes=False) + "\n" for r in rows)


def _json_text(obj):
    return json.dumps(obj, ensure_ascii=False, indent=0) + "\n"


def write_all(outputs):
    """Write every ``{path: rows (list -> jsonl) | object (-> json)}`` or none: each file goes to a
    temporary name first and all are renamed only once all are written, so a failing converter never
    leaves some of its outputs behind (or a half-written file)."""
    temps = []
    try:
        for path, payload in outputs.items():
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            tmp = f"{path}.tmp{os.getpid()}"
            temps.append((tmp, path))
            text = _jsonl_text(payload) if isinstance(payload, list) else _json_text(payload)
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
    except BaseException:
        for tmp, _ in temps:
            if os.path.exists(tmp):
                os.remove(tmp)
        raise
    for tmp, path in temps:
        os.replace(tmp, path)
