"""Dependencies of the routes: the service lives on `app.state`, built by the lifespan."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from zeus_power.bso.service import BSOService

__all__ = ["ServiceDep", "get_service"]


def get_service(request: Request) -> BSOService:
    """The app's `BSOService` (tests may override this dependency)."""
    return request.app.state.service


ServiceDep = Annotated[BSOService, Depends(get_service)]
