"""moto's S3 objects kept on disk, and read by the range asked, so a local run's memory does not
grow with its input and outputs.

moto holds each object's body in a SpooledTemporaryFile of 5 MB in memory (an open file past
that), reads a whole body for a ranged GET and slices it, and joins a multipart upload's parts
into one bytes object (twice: a bytearray, then its copy). A local job keeps every checkpoint part
of its results under 5 MB, so a run held its outputs in memory, and each shard's ranged read of
the input copied the whole input. Here a body lives in a file of its own from its first byte on
(opened only while read or written, so no descriptor stays open), a ranged GET reads its range
only, and a completed upload streams its parts into the new object's file.
"""

from __future__ import annotations

import contextvars
import os
import re
import shutil
import tempfile
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any
from unittest import mock

from moto.s3 import models as s3_models
from moto.s3.responses import S3Response

# a GET's byte range (first, last), while moto answers it
_range: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("sluice_s3_range", default=None)
_RANGE = re.compile(r"^bytes=(\d+)-(\d+)$")
_CHUNK = 1 << 20
# where the bodies of the run in progress are (`on_disk`)
_directory = tempfile.gettempdir()


class _Joined:
    """A completed upload's parts, joined in a file of their own (the parts go with the upload,
    before the object is made of them), which becomes the object's body."""

    def __init__(self, parts: Sequence[Any], directory: str) -> None:
        self.body = DiskBody(directory)
        self.size = 0
        with open(self.body.path, "wb") as joined:
            for part in parts:
                with open(part._value_buffer.path, "rb") as source:
                    shutil.copyfileobj(source, joined, _CHUNK)
                self.size += part.contentsize

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return True


class DiskBody:
    """The file-like body moto's FakeKey keeps (seek, read, write, truncate, close), in a file."""

    def __init__(self, directory: str) -> None:
        handle, self.path = tempfile.mkstemp(dir=directory, prefix="body-")
        os.close(handle)
        self._at = 0

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._at = offset if whence == os.SEEK_SET else os.path.getsize(self.path) + offset
        return self._at

    def tell(self) -> int:
        return self._at

    def truncate(self, size: int | None = None) -> int:
        end = self._at if size is None else size
        os.truncate(self.path, end)
        return end

    def write(self, data: Any) -> int:
        with open(self.path, "r+b") as body:
            body.seek(self._at)
            if not isinstance(data, _Joined):
                body.write(data)
                self._at = body.tell()
                return self._at
        # a completed upload: its joined file is this body, whole
        os.replace(data.body.path, self.path)
        self._at = data.size
        return self._at

    def read(self, size: int = -1) -> bytes:
        with open(self.path, "rb") as body:
            body.seek(self._at)
            data = body.read(size)
        self._at += len(data)
        return data

    def close(self) -> None:
        with suppress(FileNotFoundError):
            os.unlink(self.path)


class _Window(bytes):
    """The range a GET asked of a body, standing for the whole: moto's range handling takes the
    body's length and slices the range out of it, and gets just these bytes."""

    first: int
    total: int

    def __new__(cls, data: bytes, first: int, total: int) -> _Window:
        window = super().__new__(cls, data)
        window.first, window.total = first, total
        return window

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, slice) and item.step is None:
            start = 0 if item.start is None else item.start
            stop = self.total if item.stop is None else min(item.stop, self.total)
            if self.first <= start and stop <= self.first + bytes.__len__(self):
                return bytes(memoryview(self)[start - self.first : stop - self.first])
        raise IndexError("a ranged read holds its range only")


def _value(key: Any) -> bytes:
    wanted = _range.get()
    with key.lock:
        key._value_buffer.seek(0)
        if wanted is None or wanted[0] >= key.contentsize:
            return bytes(key._value_buffer.read())
        first, last = wanted[0], min(wanted[1], key.contentsize - 1)
        key._value_buffer.seek(first)
        return _Window(key._value_buffer.read(last - first + 1), first, key.contentsize)


def _complete(multipart: Any, body: Iterator[tuple[int, str]]) -> tuple[Any, str, Any]:
    """FakeMultipart.complete with its checks, its parts joined on disk rather than in memory. The
    object has a checksum of its whole only where the upload asked for one (moto's default,
    CRC64NVME of the whole object, would hold all of it in memory)."""
    asked = multipart.metadata.get("x-amz-checksum-algorithm")
    checksum_builder = s3_models.MultipartChecksumBuilder(asked, multipart.metadata.get("x-amz-checksum-type"))
    md5s = bytearray()
    parts: list[Any] = []
    for number, etag in body:
        part = multipart.parts.get(number)
        if part is None or part.etag.replace('"', "") != etag.replace('"', ""):
            raise s3_models.InvalidPart()
        if parts and parts[-1].contentsize < s3_models.S3_UPLOAD_PART_MIN_SIZE:
            raise s3_models.EntityTooSmall()
        md5s.extend(bytes.fromhex(part.etag.replace('"', "")))
        if asked:
            checksum_builder.addPart(part.value)
        parts.append(part)
    if not parts:
        raise s3_models.MalformedXML
    full_etag = s3_models.md5_hash()
    full_etag.update(bytes(md5s))
    checksum = checksum_builder.build() if asked else None
    return _Joined(parts, _directory), f"{full_etag.hexdigest()}-{len(parts)}", checksum


_key_response = S3Response.key_response
# moto's own setter: it writes the body, whatever it is, through the buffer (a DiskBody here)
_set_value = vars(s3_models.FakeKey)["value"].fset


def _ranged_key_response(self: S3Response, request: Any, full_url: str, headers: dict[str, Any]) -> Any:
    found = _RANGE.match(str(request.headers.get("range") or "")) if request.method == "GET" else None
    token = _range.set((int(found[1]), int(found[2])) if found else None)
    try:
        return _key_response(self, request, full_url, headers)
    finally:
        _range.reset(token)


@contextmanager
def on_disk() -> Iterator[None]:
    """moto's S3 bodies in files under a directory of this run's, removed after it."""
    global _directory
    with tempfile.TemporaryDirectory(prefix="sluice-s3-") as directory:
        _directory = directory
        shim = types.SimpleNamespace(**vars(tempfile))
        shim.SpooledTemporaryFile = lambda *args, **kwargs: DiskBody(directory)
        with (
            mock.patch.object(s3_models, "tempfile", shim),
            mock.patch.object(s3_models.FakeKey, "value", property(_value, _set_value)),
            mock.patch.object(s3_models.FakeMultipart, "complete", _complete),
            mock.patch.object(S3Response, "key_response", _ranged_key_response),
        ):
            yield
