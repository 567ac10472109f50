"""``python -m clipbert_legacy.tasks NAME [--config FILE] [--key value ...]``: run a task by its registered
name.

The same as ClipBERT's script paths (``python src/tasks/run_video_retrieval.py ...`` is
``python -m clipbert_legacy.tasks retrieval ...``): the class comes from the registry
(``clipbert_legacy.tasks.registry``),
then :func:`clipbert_legacy.tasks.entry.main` trains or runs inference, and returns the exit status.
A built-in task whose options are the config layer's (ClipBERT's five) has its command line parsed
(``--help`` answered, a bad key or value refused with one line) before torch, transformers and the model
are imported: about 0.3 s instead of 8 s of CPU for a typo.
"""
import sys

from clipbert_legacy.config import ConfigError, parse_args_or_exit, task_names
from clipbert_legacy.tasks import registry

USAGE = "usage: python -m clipbert_legacy.tasks NAME [--config FILE] [--key value ...]   (NAME: {names})"


def main(argv: list[str]) -> int:
    names = "|".join(registry.runnable_tasks())
    if not argv or argv[0].startswith("-"):
        print(USAGE.format(names=names), file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    name = argv[0]
    if name not in registry.BUILTIN_TASKS or name not in task_names():
        try:  # a task whose options are declared beside its class (or not a task: one line)
            registry.get_task(name)
        except ConfigError as e:
            print(f"config error: {e}", file=sys.stderr)
            return 2
    cfg = parse_args_or_exit(name, argv[1:])  # exits 0 after --help, 2 on a bad key or value
    from clipbert_legacy.tasks.entry import main as run  # torch, transformers, the model: seconds

    return run(name, cfg=cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
