"""Command line: ``python -m grader <command>``; ``python -m grader --help`` lists them."""
import sys

try:
    import torch  # noqa: F401 - every command needs it; say so plainly when this Python lacks it
except ImportError:
    sys.exit("grader: this Python has no PyTorch. Use the course's environment: `.venv/bin/python -m grader ...` "
             "(`make setup` creates it), or activate your own environment that has torch.")

from grader.cli import main  # noqa: E402 - after the check above

raise SystemExit(main())
