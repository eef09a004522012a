"""The wire: frames cut anywhere still parse, large buffers travel out of band, limits hold, the handshake's MACs."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import pytest

from async_batcher.shared import _wire


def frames(control: list[Any], values: list[Any], limit: int = 2**30) -> bytes:
    chunks = _wire.encode(control, values, limit)
    body = b"".join(bytes(c) for c in chunks)
    return body  # (encode's first chunk starts with the prefix)


def read(data: bytes, cuts: list[int], limit: int = 2**30) -> list[tuple[list[Any], list[Any], bool]]:
    """Feed ``data`` to a Reader cut at ``cuts``; what it delivered."""
    got: list[tuple[list[Any], list[Any], bool]] = []

    def deliver(body: memoryview, owned: bool) -> None:
        control, values = _wire.decode(body, owned)
        got.append((control, values(), owned))

    reader = _wire.Reader(limit, deliver)
    pos = 0
    for cut in [*(c for c in cuts if c < len(data)), len(data)]:
        while pos < cut:
            buf = reader.get_buffer()
            n = min(len(buf), cut - pos)
            buf[:n] = data[pos : pos + n]
            reader.updated(n)
            pos += n
    return got


@pytest.mark.parametrize("cuts", [[], [1], [3, 4, 5], list(range(1, 200, 7))])
def test_frames_cut_anywhere_parse(cuts: list[int]) -> None:
    data = frames([1, (_wire.CANCEL, 2)], ["one"]) + frames([(_wire.ACK, 3, 4)], []) + frames([5], [[1, 2]])
    assert [(c, v) for c, v, _ in read(data, cuts)] == [
        ([1, (_wire.CANCEL, 2)], ["one"]),
        ([(_wire.ACK, 3, 4)], []),
        ([5], [[1, 2]]),
    ]


def test_large_buffers_travel_out_of_band_aligned_and_arrive_as_views() -> None:
    np = pytest.importorskip("numpy")
    array = np.arange(100_000, dtype=np.float64)  # 800 kB: out of band
    chunks = _wire.encode([1], [array], 2**30)
    assert any(isinstance(c, memoryview) and c.nbytes == array.nbytes for c in chunks)  # not copied into the pickle
    data = b"".join(bytes(c) for c in chunks) + frames([2], ["after"])
    (control, values, owned), after = read(data, [10, 5000])
    assert owned and control == [1]
    got = values[0]
    assert (got == array).all() and got.flags.writeable
    assert after[:2] == ([2], ["after"])


def test_a_frame_over_the_limit_is_refused_by_both_ends() -> None:
    with pytest.raises(_wire.TooLarge) as raised:
        _wire.encode([1], [b"x" * 5000], 4096)
    assert raised.value.limit == 4096 and raised.value.size > 5000
    data = frames([1], [b"x" * 5000])
    with pytest.raises(_wire.Violation, match="over the limit"):
        read(data, [], limit=4096)


def test_a_body_that_does_not_parse_is_a_violation_and_values_fail_apart() -> None:
    with pytest.raises(_wire.Violation):
        _wire.decode(memoryview(b"\x00" * 20), False)
    ctl, bad = pickle.dumps([7]), pickle.dumps([1])[:-2]  # values cut short: their records fail, not the frame
    body = struct.pack("<IIII", len(ctl), len(bad), 0, 0) + ctl + bad
    for owned in (False, True):
        control, values = _wire.decode(memoryview(bytearray(body)), owned)
        assert control == [7]
        with pytest.raises(pickle.UnpicklingError):
            values()


def test_the_handshake_answers_hold_for_one_direction_and_key_only() -> None:
    key, challenge = b"k" * 32, _wire.challenge()
    given = _wire.answer(key, challenge, b"client")
    assert _wire.verify(key, challenge, b"client", given)
    assert not _wire.verify(key, challenge, b"owner", given)
    assert not _wire.verify(b"x" * 32, challenge, b"client", given)
    assert _wire.parse_hello(_wire.hello(42, 1024, 1.5)) == (42, 1024, 1.5)
    with pytest.raises(_wire.Violation, match="not an async-batcher"):
        _wire.parse_hello(b"GET / HTTP/1.1")


def test_the_gone_board_says_which_items_went_and_takes_a_shared_slot_as_gone(tmp_path: Any) -> None:
    from async_batcher.shared._board import SLOTS, Board

    client = Board.create(str(tmp_path / "b.sock"))
    owner = Board.attach(client.path)
    client.unlink()  # (both keep their mapping)
    for id in (3, 5, 7 + SLOTS):
        owner.mark(id)
    assert client.gone([3, 4, 5]) == {3, 5}
    assert client.gone([7, 7 + SLOTS, 9]) == {7, 7 + SLOTS}  # (a slot two share: neither can be told apart)
    owner.close()
    client.close()
    with pytest.raises(FileNotFoundError):
        Board.attach(client.path)


def test_a_value_that_does_not_unpickle_is_broken_alone_and_the_buffers_of_the_others_stay_theirs() -> None:
    np = pytest.importorskip("numpy")
    from tests.shared.test_crossing import Stranger

    first, second = np.arange(20_000, dtype=np.float64), np.arange(30_000, dtype=np.int32)  # out of band, both
    data = frames([1, 2, 3, 4], [first, Stranger(), second, "plain"])
    for cuts in ([], [7, 70_000]):
        ((control, values, owned),) = read(data, cuts)
        assert control == [1, 2, 3, 4] and owned
        assert isinstance(values[1], _wire.Broken) and "cannot be rebuilt" in str(values[1].error)
        assert (values[0] == first).all() and (values[2] == second).all() and values[3] == "plain"
    small = frames([5, 6], [Stranger(), [1, 2]])  # (in the receive buffer, not a buffer of its own)
    ((_, values, owned),) = read(small, [])
    assert not owned and isinstance(values[0], _wire.Broken) and values[1] == [1, 2]
