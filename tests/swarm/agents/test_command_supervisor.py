from swarm.agents.command_supervisor import BoundedOutput


def test_bounded_output_keeps_the_head_and_tail_and_counts_what_it_dropped():
    output = BoundedOutput(head_limit=10, tail_limit=6)
    for number in range(100_000):
        output.add(f"{number:06d}\n".encode())
    assert len(output.head) == 10 and len(output.tail) <= 2 * 6 + 7
    dropped = 100_000 * 7 - 10 - 6
    assert output.text() == f"000000\n000\n[... {dropped} bytes of output dropped here ...]\n99999\n"


def test_a_short_output_is_kept_whole():
    output = BoundedOutput(head_limit=10, tail_limit=10)
    output.add(b"hello ")
    output.add(b"world, again")
    assert output.text() == "hello world, again"
