"""The option table of docs/config_reference.md, generated from the schema
(``python -m clipbert_legacy.config``)."""
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

from clipbert_legacy.config.schema import Option
from clipbert_legacy.config.tasks import documented_tasks, task_options


def config_reference_markdown(tasks: Optional[Iterable[str]] = None) -> str:
    """Markdown table of every option (docs/config_reference.md), generated from the schema of ``tasks``
    (default: every registered task with options of its own,
    :func:`~clipbert_legacy.config.tasks.documented_tasks`)."""
    tasks = documented_tasks() if tasks is None else tasks
    rows = {}  # name -> [[option, tasks]]: one row per distinct definition of a name
    for t in tasks:
        for name, o in task_options(t).items():
            same = next((r for r in rows.setdefault(name, []) if _same(r[0], o)), None)
            if same is None:
                rows[name].append([o, [t]])
            else:
                same[1].append(t)
    root = {id(o) for o in task_options("shared").values()}  # options every task has
    lines = ["| option | type | default | allowed | tasks | description |",
             "|---|---|---|---|---|---|"]
    for name, (o, ts) in ((n, r) for n, defs in rows.items() for r in defs):
        allowed = "|".join(str(c) for c in o.choices) if o.choices else _range_text(o)
        scope = "all" if id(o) in root and len(rows[name]) == 1 else ", ".join(ts)
        desc = o.help if not o.unused else f"*{o.unused}*"
        if o.json_only:
            desc += " (JSON only)"
        if o.derived:
            desc = f"*{desc}*"
        default = "" if o.json_only else f"`{json.dumps(o.default)}`"
        cells = [f"`{name}`", o.type_name(), default, allowed, scope, desc]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _same(a: Option, b: Option) -> bool:
    """Two tasks' options of one name document the same thing (one table row)."""
    return (a.type, a.default, a.choices, a.help, a.unused, a.min, a.max) == \
        (b.type, b.default, b.choices, b.help, b.unused, b.min, b.max)


def _range_text(o: Option) -> str:
    parts = []
    if o.min is not None:
        parts.append(("> " if o.min_exclusive else ">= ") + f"{o.min:g}")
    if o.max is not None:
        parts.append(f"<= {o.max:g}")
    return ", ".join(parts)


REFERENCE_BEGIN = "<!-- BEGIN CONFIG REFERENCE -->"  # the generated table sits between these markers
REFERENCE_END = "<!-- END CONFIG REFERENCE -->"
REFERENCE_PATH = Path(__file__).resolve().parents[2] / "docs" / "config_reference.md"


def update_reference(path: str | Path = REFERENCE_PATH) -> bool:
    """Rewrite the generated config table between the file's markers; True if it changed."""
    path = Path(path)
    text = path.read_text()
    if REFERENCE_BEGIN not in text or REFERENCE_END not in text:
        raise ValueError(f"{path}: markers {REFERENCE_BEGIN} / {REFERENCE_END} not found")
    head, rest = text.split(REFERENCE_BEGIN, 1)
    _, tail = rest.split(REFERENCE_END, 1)
    new = f"{head}{REFERENCE_BEGIN}\n{config_reference_markdown()}{REFERENCE_END}{tail}"
    if new != text:
        path.write_text(new)
    return new != text

