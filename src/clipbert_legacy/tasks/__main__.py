"""``python -m clipbert_legacy.tasks NAME [--config FILE] [--key value ...]``: run a task by its registered
name.

The same as ClipBERT's script paths (``python src/tasks/run_video_retrieval.py ...`` is
``python -m clipbert_legacy.tasks retrieval ...``): the class comes from the registry
(``clipbert_legacy.tasks.registry``),
then :func:`clipbert_legacy.tasks.entry.main` parses, trains or runs inference, and returns the exit status.
"""
import sys

from clipbert_legacy.config import ConfigError
from clipbert_legacy.tasks import registry
from clipbert_legacy.tasks.entry import main as run

USAGE = "usage: python -m clipbert_legacy.tasks NAME [--config FILE] [--key value ...]   (NAME: {names})"


def main(argv: list[str]) -> int:
    names = "|".join(registry.runnable_tasks())
    if not argv or argv[0].startswith("-"):
        print(USAGE.format(names=names), file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    try:
        task_cls = registry.get_task(argv[0])
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    return run(task_cls, argv=argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
