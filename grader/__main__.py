"""Command line: ``python -m grader <command>``; ``python -m grader --help`` lists them."""
from grader.cli import main

raise SystemExit(main())
