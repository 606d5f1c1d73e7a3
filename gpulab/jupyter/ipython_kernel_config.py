# Kernel settings for `make lab`, copied into the venv's etc/ipython/ (where IPython's kernels read them).
# ipykernel warns on every kernel start that its local TCP sockets are not encrypted; `make lab` serves on
# 127.0.0.1, so the warning tells a learner nothing. This drops that one message and keeps every other.
import logging


class _QuietLocalTCP(logging.Filter):
    def filter(self, record):
        return "running over TCP without encryption" not in record.getMessage()


logging.getLogger("IPKernelApp").addFilter(_QuietLocalTCP())
