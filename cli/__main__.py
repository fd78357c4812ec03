"""``python -m cli``: the same as the ``dtrain-tui`` command. A Ctrl-C while the first modules
load is exit 130, never a traceback."""

import sys

try:
    from cli import main

    code = main()
except KeyboardInterrupt:
    try:
        print("dtrain-tui: interrupted", file=sys.stderr)
    except (OSError, ValueError):
        pass
    code = 130
sys.exit(code)
