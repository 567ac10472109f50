"""``python -m clipbert_legacy.legacy [--cpu] [--uint8-masks] SCRIPT ARGS...`` (see ``launcher``)."""
import sys

from clipbert_legacy.legacy.launcher import main

if __name__ == "__main__":
    sys.exit(main())
