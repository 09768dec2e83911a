"""``python -m perseus.train`` (under torchrun): see `perseus.train.cli`."""

from __future__ import annotations

import sys

from perseus.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
