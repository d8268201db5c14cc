"""moto, in the server process bench/scale/memory.py measures Merge and MarkFailed beside, made to
hold a job of 10^7 lines: its objects in files, not in memory.

moto keeps each object under MOTO_S3_DEFAULT_KEY_BUFFER_SIZE in memory (5 MiB by default: every
shard's outputs, 10 GB at 10^7 lines), writes a bigger one into memory before it rolls over to a
file, and completes a multipart upload by joining its parts in memory and copying that (20 GB for
Merge's 10 GB of results). Here objects over a megabyte live in temporary files from their first
byte and a completed upload is joined in one, mapped. What S3 answers is unchanged.

Imported by the server alone (`bench.plan.moto_server(MOTO_PATCHES, MOTO_ENV)` in memory.py), never
beside moto in-process, whose objects it would change for every test.
"""

from __future__ import annotations

import codecs
import mmap
import tempfile
from collections.abc import Iterator
from typing import Any

from moto.s3 import models

_set_value = models.FakeKey.value.fset  # type: ignore[attr-defined]


def _value(self: Any, new_value: Any) -> None:
    # a value past the buffer goes to its file at once, not to memory first
    if len(new_value) > self._max_buffer_size:
        self._value_buffer.seek(0)
        self._value_buffer.truncate()
        self._value_buffer.rollover()
    _set_value(self, new_value)


def _complete(self: Any, body: Iterator[tuple[int, str]]) -> tuple[Any, str, Any]:
    """moto's FakeMultipart.complete, the parts joined in a file and handed over mapped."""
    decode_hex = codecs.getdecoder("hex_codec")
    md5s = bytearray()
    checksum = models.MultipartChecksumBuilder(
        self.metadata.get("x-amz-checksum-algorithm"), self.metadata.get("x-amz-checksum-type")
    )
    last = None
    count = 0
    # the mapping keeps the file it maps (mmap holds a descriptor of its own) once this one closes
    with tempfile.TemporaryFile() as joined:
        for number, etag in body:
            part = self.parts.get(number)
            if part is None or part.etag.replace('"', "") != etag.replace('"', ""):
                raise models.InvalidPart()
            if last is not None and last.contentsize < models.S3_UPLOAD_PART_MIN_SIZE:
                raise models.EntityTooSmall()
            md5s.extend(decode_hex(part.etag.replace('"', ""))[0])  # type: ignore[arg-type]
            value = part.value
            joined.write(value)
            checksum.addPart(value)
            last = part
            count += 1
        if count == 0:
            raise models.MalformedXML()
        joined.flush()
        mapped: Any = mmap.mmap(joined.fileno(), 0, access=mmap.ACCESS_READ) if joined.tell() else b""
    full = models.md5_hash()
    full.update(bytes(md5s))
    return mapped, f"{full.hexdigest()}-{count}", checksum.build()


models.FakeKey.value = models.FakeKey.value.setter(_value)  # type: ignore[attr-defined,method-assign]
models.FakeMultipart.complete = _complete  # type: ignore[method-assign,assignment]
