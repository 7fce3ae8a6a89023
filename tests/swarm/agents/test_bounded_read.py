import io

from swarm.agents.bounded_read import Line, is_binary, text_lines


def lines_of(data: bytes, **options) -> list[Line]:
    return list(text_lines(io.BufferedReader(io.BytesIO(data)), **options))


def test_lines_are_numbered_and_lose_their_line_ending():
    assert lines_of(b"one\r\ntwo\n\nlast") == [Line(1, "one"), Line(2, "two"), Line(3, ""), Line(4, "last")]
    assert lines_of(b"") == []


def test_a_line_past_the_bound_is_cut_and_the_rest_counted_not_kept():
    lines = lines_of(b"short\n" + b"x" * 100_000 + b"\nafter\n" + b"y" * 50, max_line_bytes=10)
    assert lines == [Line(1, "short"), Line(2, "x" * 10, cut_bytes=99_990), Line(3, "after"),
                     Line(4, "y" * 10, cut_bytes=40)]


def test_invalid_utf8_is_replaced_not_fatal():
    assert lines_of(b"caf\xe9\n") == [Line(1, "caf\ufffd")]


def test_binary_sniffing_leaves_the_file_at_its_start():
    file = io.BufferedReader(io.BytesIO(b"text\x00more"))
    assert is_binary(file) and file.read() == b"text\x00more"
