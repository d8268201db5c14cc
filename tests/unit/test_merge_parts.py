from __future__ import annotations

import functools
import io
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sluice.merge import merge
from sluice.merge.merge import plan_parts

MIN = 100


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=450), max_size=25))
@pytest.mark.slow
def test_parts_keep_order_cover_everything_and_respect_the_minimum(sizes: list[int]) -> None:
    parts = plan_parts(sizes, min_part=MIN, max_part=4 * MIN)
    covered = [(p.source, p.start, p.end) for part in parts for p in part.pieces]
    expected_pos = {i: 0 for i in range(len(sizes))}
    last = (-1, 0)
    for source, start, end in covered:
        assert (source, start) >= last
        assert start == expected_pos[source] and end > start
        expected_pos[source] = end
        last = (source, end)
    assert all(expected_pos[i] == size for i, size in enumerate(sizes))
    for part in parts[:-1]:
        assert part.size >= MIN
    for part in parts:
        assert part.size <= 4 * MIN or not part.copy
        if part.copy:
            assert len(part.pieces) == 1


def test_large_sources_are_copied_and_only_seams_are_downloaded() -> None:
    parts = plan_parts([30, 500, 20, 600], min_part=MIN)
    downloaded = sum(part.size for part in parts if not part.copy)
    assert sum(part.size for part in parts) == 1150
    assert downloaded <= 3 * MIN
    assert [part.copy for part in parts] == [False, True, False, True]


class Bucket:
    """Just enough of S3 for `concatenate`: ranged reads and a multipart upload whose parts take a
    while, so that the parts read and uploaded at once are seen."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.parts: dict[int, bytes] = {}
        self.through = self.most_through = 0
        self.lock = threading.Lock()

    def get_object(self, *, Bucket: str, Key: str, Range: str) -> dict[str, Any]:
        start, end = (int(n) for n in Range.removeprefix("bytes=").split("-"))
        return {"Body": io.BytesIO(self.objects[Key][start : end + 1])}

    def create_multipart_upload(self, **_: Any) -> dict[str, Any]:
        return {"UploadId": "u"}

    def upload_part(self, *, PartNumber: int, Body: Any, **_: Any) -> dict[str, Any]:
        with self.lock:
            self.through += 1
            self.most_through = max(self.most_through, self.through)
        time.sleep(0.01)
        self.parts[PartNumber] = bytes(Body)
        with self.lock:
            self.through -= 1
        return {"ETag": f"e{PartNumber}"}

    def upload_part_copy(self, *, PartNumber: int, CopySource: dict[str, str], CopySourceRange: str, **_: Any) -> Any:
        start, end = (int(n) for n in CopySourceRange.removeprefix("bytes=").split("-"))
        self.parts[PartNumber] = self.objects[CopySource["Key"]][start : end + 1]
        return {"CopyPartResult": {"ETag": f"e{PartNumber}"}}

    def complete_multipart_upload(self, *, Key: str, MultipartUpload: dict[str, Any], **_: Any) -> None:
        self.objects[Key] = b"".join(self.parts[p["PartNumber"]] for p in MultipartUpload["Parts"])


def test_a_concatenation_reads_and_uploads_a_few_parts_at_once_whatever_their_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each part that passes through the process holds up to 2 * MIN_PART bytes while it is sent:
    THROUGH_IN_FLIGHT of them at once, not one for each of the pool's threads, so what Merge holds
    does not grow with the job's parts until they fill the pool."""
    monkeypatch.setattr(merge, "plan_parts", functools.partial(plan_parts, min_part=MIN, max_part=4 * MIN))
    sources = {f"s{n}": bytes([65 + n % 26]) * (30 + 7 * n) for n in range(60)}
    sources["big"] = b"z" * (5 * MIN)
    bucket = Bucket(dict(sources))
    keys = list(sources)
    moved = merge.concatenate(
        bucket, "b", keys, "out", content_type="application/jsonl", sizes=[len(sources[k]) for k in keys]
    )
    assert bucket.objects["out"] == b"".join(sources[k] for k in keys)
    assert moved["bytes_through"] + moved["bytes_copied"] == sum(map(len, sources.values()))
    assert moved["parts"] > 2 * merge.THROUGH_IN_FLIGHT
    assert bucket.most_through <= merge.THROUGH_IN_FLIGHT
