"""``python -m src.config``: print the README's option table; ``--update-readme README.md`` rewrites it."""
import sys

from src.config.reference import config_reference_markdown, update_readme


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "--update-readme":
        print("updated" if update_readme(argv[1]) else "up to date", argv[1])
    else:
        sys.stdout.write(config_reference_markdown())


if __name__ == "__main__":
    main(sys.argv[1:])
