"""A Files API file's metadata (OpenAI's file object) and id rules, for every file store."""

from __future__ import annotations

import os
import time
from typing import Any


def valid_id(file_id: str) -> bool:
    return file_id.startswith("file-") and file_id[5:].isalnum() and len(file_id) <= 64


def new_file(purpose: str, filename: str, size: int) -> dict[str, Any]:
    """A new file's metadata, as OpenAI's file object."""
    return {
        "id": "file-" + os.urandom(12).hex(),
        "object": "file",
        "bytes": size,
        "created_at": int(time.time()),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }
