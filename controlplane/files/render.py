from __future__ import annotations

from typing import Any

from controlplane.files.models import File


def file_render(file: File) -> dict[str, Any]:
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": int(file.created_at.timestamp()),
        "expires_at": int(file.expires_at.timestamp()) if file.expires_at else None,
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
    }
