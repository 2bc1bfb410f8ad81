from __future__ import annotations

from fastapi import APIRouter

from kvx.compute.device import device_info
from kvx.compute import VERSION

router = APIRouter(tags=["health"])


@router.get("/health", summary="Version and the device the kernels run on")
def health() -> dict:
    return {"status": "ok", "version": VERSION, **device_info()}
