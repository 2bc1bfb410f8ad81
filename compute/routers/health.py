from __future__ import annotations

from fastapi import APIRouter

from kvx.compute.device import device_info
from kvx.compute import VERSION

router = APIRouter(tags=["health"])


@router.get("/health", summary="Version and the device the kernels run on")
async def health() -> dict:      # device_info() is cached: no thread needed
    return {"status": "ok", "version": VERSION, **device_info()}
