"""jsonl annotation loading (ujson) with errors that name the file, line and field."""
import os

import ujson


def load_jsonl(path, required_fields=(), any_of_fields=(), str_fields=()):
    """List of dicts, one per non-blank line. Raises ValueError naming file:line on bad JSON, a
    missing field or a `str_fields` value that is not a non-empty string (a null or numeric caption
    would otherwise fail deep inside the tokenizer); `any_of_fields` is a tuple of alternative names
    of which one must be present."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"annotation file {path} not found")
    rows = []
    with open(path, encoding="utf-8-sig") as f:  # -sig: a BOM (Windows editors) is not part of line 1
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = ujson.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e}); fix or remove this line") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            missing = [k for k in required_fields if k not in row]
            if any_of_fields and not any(k in row for k in any_of_fields):
                missing.append("|".join(any_of_fields))
            if missing:
                raise ValueError(f"{path}:{lineno}: missing field(s) {missing}; present: {sorted(row)}")
            for k in str_fields:
                if k in row and not (isinstance(row[k], str) and row[k].strip()):
                    raise ValueError(f"{path}:{lineno}: field {k!r} must be a non-empty string, got "
                                     f"{ujson.dumps(row[k])}; fix or remove this line")
            rows.append(row)
    if not rows:
        raise ValueError(f"annotation file {path} has no examples")
    return rows


def load_json(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"json file {path} not found")
    with open(path, encoding="utf-8-sig") as f:
        try:
            return ujson.load(f)
        except ValueError as e:
            raise ValueError(f"{path}: invalid JSON ({e})") from None
