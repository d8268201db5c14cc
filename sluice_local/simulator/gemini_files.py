"""Gemini's Files API: uploads (a batch's JSONL input) and the responses files batches write.

`POST /upload/v1beta/files` takes a file as Google's SDKs send it: resumably (a `start` with the
metadata, then chunks to the upload URL it answered, each at its offset, the last one `finalize`),
as one multipart/related body (metadata, then media), or raw (`uploadType=media`). The upload URL
carries its session and, as Google's, needs no key. `GET /v1beta/files/{id}` describes a file,
`DELETE` removes it, `GET /v1beta/files` lists them, and a file a batch wrote (source GENERATED)
downloads at `GET /download/v1beta/files/{id}:download?alt=media`; an uploaded one does not, as on
Google's. A file nobody has is 403 PERMISSION_DENIED, as Google answers one that is not yours or
does not exist.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import BodyPartReader, web

from sluice_local.simulator.core import Core
from sluice_local.simulator.wire import ApiError, json_response, rfc3339

_EXPIRES_S = 48 * 3600
# the chunk size Google's uploads ask clients to send in multiples of
_GRANULARITY = 8 * 1024 * 1024


@dataclass(slots=True)
class GeminiFile:
    id: str
    display_name: str
    mime_type: str
    content: bytes
    created: float
    source: str  # "UPLOADED" | "GENERATED"


@dataclass(slots=True)
class Session:
    display_name: str
    mime_type: str
    declared: int | None
    received: bytearray = field(default_factory=bytearray)


class GeminiFiles:
    """The stored files, the open upload sessions and the Files API's routes."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self.files: dict[str, GeminiFile] = {}
        self.sessions: dict[str, Session] = {}

    def reset(self) -> None:
        self.files.clear()
        self.sessions.clear()

    def routes(self, app: web.Application, version: str) -> None:
        """The routes under `version`; under v1 those OpenAI's Files API has too are the app's to share."""
        app.router.add_post(f"/upload/{version}/files", self.upload)
        app.router.add_get(f"/download/{version}/files/{{id}}", self.download)
        if version != "v1":
            app.router.add_get(f"/{version}/files", self.list_files)
            app.router.add_get(f"/{version}/files/{{id}}", self.retrieve)
            app.router.add_delete(f"/{version}/files/{{id}}", self.delete)

    def store(self, display_name: str, mime_type: str, content: bytes, source: str) -> GeminiFile:
        ident = self._core.new_id("").lower()
        stored = GeminiFile(ident, display_name, mime_type, content, time.time(), source)
        self.files[ident] = stored
        return stored

    def get(self, name: str) -> GeminiFile:
        """The file named `files/{id}` (or `{id}`), or the 403 Google answers for one not there."""
        ident = name.removeprefix("files/").partition(":")[0]
        found = self.files.get(ident)
        if found is None:
            raise ApiError(403, f"You do not have permission to access the File {ident} or it may not exist.")
        return found

    def describe(self, request: web.Request, stored: GeminiFile) -> dict[str, Any]:
        origin = str(request.url.origin())
        version = next((v for v in ("v1beta", "v1") if f"/{v}/" in request.path), "v1beta")
        described = {
            "name": f"files/{stored.id}",
            "displayName": stored.display_name,
            "mimeType": stored.mime_type,
            "sizeBytes": str(len(stored.content)),
            "createTime": rfc3339(stored.created),
            "updateTime": rfc3339(stored.created),
            "expirationTime": rfc3339(stored.created + _EXPIRES_S),
            "sha256Hash": base64.b64encode(hashlib.sha256(stored.content).hexdigest().encode()).decode(),
            "uri": f"{origin}/{version}/files/{stored.id}",
            "state": "ACTIVE",
            "source": stored.source,
        }
        if stored.source == "GENERATED":
            described["downloadUri"] = f"{origin}/download/{version}/files/{stored.id}:download?alt=media"
        return described

    async def upload(self, request: web.Request) -> web.StreamResponse:
        session = request.query.get("upload_id")
        if session is not None:
            return await self._chunk(request, session)
        protocol = request.headers.get("X-Goog-Upload-Protocol", "").lower()
        if protocol == "resumable":
            return await self._start(request)
        if protocol == "multipart" or request.content_type.startswith("multipart/"):
            return await self._multipart(request)
        if protocol == "raw" or request.query.get("uploadType") == "media":
            content = await request.read()
            stored = self.store("", request.content_type or "application/octet-stream", content, "UPLOADED")
            return json_response({"file": self.describe(request, stored)})
        raise ApiError(400, "Upload requests must use the resumable, multipart or raw upload protocol.")

    async def _start(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("X-Goog-Upload-Command", "").lower() != "start":
            raise ApiError(400, "A resumable upload starts with X-Goog-Upload-Command: start.")
        raw = await request.read()
        meta = orjson.loads(raw) if raw.strip() else {}
        wanted = meta.get("file") if isinstance(meta, dict) else None
        wanted = wanted if isinstance(wanted, dict) else {}
        declared = request.headers.get("X-Goog-Upload-Header-Content-Length")
        mime = request.headers.get("X-Goog-Upload-Header-Content-Type") or wanted.get("mimeType")
        session_id = self._core.new_id("gsimup")
        self.sessions[session_id] = Session(
            str(wanted.get("displayName") or ""),
            str(mime or "application/octet-stream"),
            int(declared) if declared and declared.isdigit() else None,
        )
        url = f"{request.url.origin()}{request.path}?upload_id={session_id}&upload_protocol=resumable"
        headers = {
            "x-goog-upload-url": url,
            "x-goog-upload-status": "active",
            "x-goog-upload-chunk-granularity": str(_GRANULARITY),
        }
        return web.Response(status=200, headers=headers)

    async def _chunk(self, request: web.Request, session_id: str) -> web.StreamResponse:
        session = self.sessions.get(session_id)
        if session is None:
            raise ApiError(404, "No upload session with this id.")
        commands = {c.strip() for c in request.headers.get("X-Goog-Upload-Command", "").lower().split(",")}
        if "upload" in commands:
            offset = request.headers.get("X-Goog-Upload-Offset", "")
            if offset != str(len(session.received)):
                raise ApiError(400, f"The upload offset {offset!r} is not where the upload stands.")
            session.received += await request.read()
        if "finalize" not in commands:
            return web.Response(
                status=200,
                headers={"x-goog-upload-status": "active", "x-goog-upload-size-received": str(len(session.received))},
            )
        if session.declared is not None and len(session.received) != session.declared:
            raise ApiError(
                400, f"The upload holds {len(session.received)} bytes; its start declared {session.declared}."
            )
        del self.sessions[session_id]
        stored = self.store(session.display_name, session.mime_type, bytes(session.received), "UPLOADED")
        response = json_response({"file": self.describe(request, stored)})
        response.headers["x-goog-upload-status"] = "final"
        return response

    async def _multipart(self, request: web.Request) -> web.StreamResponse:
        reader = await request.multipart()
        meta: dict[str, Any] = {}
        media: tuple[str, bytes] | None = None
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                continue
            content = await part.read()
            kind = part.headers.get("Content-Type", "application/octet-stream")
            if not meta and media is None and kind.startswith("application/json"):
                loaded = orjson.loads(content)
                meta = loaded.get("file", {}) if isinstance(loaded, dict) else {}
            else:
                media = (kind, bytes(content))
        if media is None:
            raise ApiError(400, "A multipart upload needs its media part.")
        mime = str(meta.get("mimeType") or media[0])
        stored = self.store(str(meta.get("displayName") or ""), mime, media[1], "UPLOADED")
        return json_response({"file": self.describe(request, stored)})

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        ident = request.match_info["id"]
        if ident.endswith(":download"):
            return await self.download(request)
        return json_response(self.describe(request, self.get(ident)))

    async def download(self, request: web.Request) -> web.StreamResponse:
        stored = self.get(request.match_info["id"])
        if stored.source != "GENERATED":
            raise ApiError(400, "Only generated files can be downloaded; this file was uploaded.")
        return web.Response(body=stored.content, content_type="application/octet-stream")

    async def delete(self, request: web.Request) -> web.StreamResponse:
        stored = self.get(request.match_info["id"])
        del self.files[stored.id]
        return json_response({})

    async def list_files(self, request: web.Request) -> web.StreamResponse:
        return json_response({"files": [self.describe(request, f) for f in reversed(self.files.values())]})
