"""The Files API: uploads (batch input) and the output and error files batches write."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sluice_local.simulator.core import Core
from sluice_local.simulator.wire import ApiError, json_response, not_found


@dataclass(slots=True)
class File:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


class Files:
    """The stored files and the /v1/files routes."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self.files: dict[str, File] = {}
        # gone for clients, kept for tests that check what a batch answered
        self.deleted: dict[str, File] = {}

    def reset(self) -> None:
        self.files.clear()
        self.deleted.clear()

    def store(self, filename: str, purpose: str, content: bytes) -> File:
        stored = File(self._core.new_id("file-sim"), filename, purpose, content, int(time.time()))
        self.files[stored.id] = stored
        return stored

    def get(self, ident: str) -> File:
        found = self.files.get(ident)
        if found is None:
            raise not_found("file", ident)
        return found

    async def upload(self, request: web.Request) -> web.StreamResponse:
        if not request.content_type.startswith("multipart/"):
            raise ApiError(400, "Files must be uploaded as multipart/form-data.", code="invalid_request")
        form = await request.post()
        purpose = form.get("purpose")
        upload = form.get("file")
        if not isinstance(purpose, str) or not purpose:
            raise ApiError(
                400, "Missing required parameter: 'purpose'.", param="purpose", code="missing_required_parameter"
            )
        if not isinstance(upload, web.FileField):
            raise ApiError(400, "Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
        stored = self.store(upload.filename or "upload", purpose, upload.file.read())
        return json_response(stored.describe())

    async def list_files(self, request: web.Request) -> web.StreamResponse:
        purpose = request.query.get("purpose")
        data = [f.describe() for f in reversed(self.files.values()) if purpose in (None, f.purpose)]
        return json_response({"object": "list", "data": data, "has_more": False})

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.get(request.match_info["id"]).describe())

    async def content(self, request: web.Request) -> web.StreamResponse:
        found = self.get(request.match_info["id"])
        return web.Response(body=found.content, content_type="application/octet-stream")

    async def delete(self, request: web.Request) -> web.StreamResponse:
        found = self.get(request.match_info["id"])
        self.deleted[found.id] = self.files.pop(found.id)
        return json_response({"id": found.id, "object": "file", "deleted": True})
