"""The two consoles every command prints through: results to stdout, errors to stderr. Soft wrap: a
message (ids, paths) is never broken across lines, so logs stay greppable; tables and panels are
printed with soft_wrap=False so that they fit the width."""

from rich.console import Console

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
