from hypothesis import given, settings
from hypothesis import strategies as st
from sluice.merge import plan_parts

MIN = 100


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=450), max_size=25))
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
