"""`python -m batchctl`, for machines where the console script is not on PATH."""

from batchctl.main import app

app(prog_name="batchctl")
