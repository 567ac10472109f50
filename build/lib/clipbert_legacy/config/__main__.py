"""``python -m clipbert_legacy.config``: print the option table; ``--update-docs`` rewrites
docs/config_reference.md.

An entry point (it sits with the tasks, above every layer): it loads every built-in task of the registry
first, so a task whose spec is declared beside its class is documented too.
"""
import sys

from clipbert_legacy.config.reference import REFERENCE_PATH, config_reference_markdown, update_reference
from clipbert_legacy.tasks.registry import load_builtin_tasks

MOVED = "note: the config reference moved from the README to docs/config_reference.md (--update-docs)"


def main(argv: list[str]) -> None:
    """``--update-docs [FILE]``; the old ``--update-readme FILE`` still works (regenerates the docs file)."""
    load_builtin_tasks()
    if argv[:1] == ["--update-readme"]:
        print(MOVED, file=sys.stderr)
        argv = ["--update-docs"]
    if argv[:1] == ["--update-docs"]:
        path = argv[1] if len(argv) > 1 else REFERENCE_PATH
        print("updated" if update_reference(path) else "up to date", path)
    else:
        sys.stdout.write(config_reference_markdown())


if __name__ == "__main__":
    main(sys.argv[1:])
