"""``python -m perseus.server [--host H] [--port P] [--round-timeout S]`` (= `perseus serve`)."""

from __future__ import annotations

import typer

from perseus.cli.serve import serve


def main() -> None:
    typer.run(serve)


if __name__ == "__main__":
    main()
