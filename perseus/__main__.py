"""`python -m perseus` is the `perseus` command."""

from perseus.cli import app

app(prog_name="perseus")
