"""``python -m profparse ...``: the ``profparse`` command, for an environment whose scripts folder is not on PATH."""

from __future__ import annotations

from profparse.cli.main import entry

if __name__ == "__main__":
    entry()
