"""kernels/cpu/csrc/task_pool.c, the decode kernels' threads, driven through ctypes with Python tasks: every task
runs once, on the slots asked for, on the pool's threads as well as the caller's, the caller's from the front and
the others' from the back, from several callers at once, from inside a task, and in a forked child."""
import ctypes
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kernels.cpu import native
from kernels.cpu.signatures import declare

ROOT = Path(__file__).parents[3]
HANG_GUARD_S = 60   # seconds; reaching it means a lost task or a deadlock, never a slow machine
TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int)


@pytest.fixture(scope="module")
def pool():
    library = native.load(native.POOL)
    if library is None:
        pytest.skip("no C compiler for the kernels")
    return declare(library, {
        "swarm_pool_run": ([TASK, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int], None),
        "swarm_pool_counts": ([ctypes.c_void_p], None)})


def run(pool, tasks: int, threads: int, body=lambda task, slot: None) -> list[tuple[int, int]]:
    """(task, slot) of every call the job made, in the order they returned"""
    calls, lock = [], threading.Lock()

    def task(_context, index, slot):
        body(index, slot)
        with lock:
            calls.append((index, slot))
    pool.swarm_pool_run(TASK(task), None, tasks, threads)
    return calls


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("tasks", [0, 1, 2, 7, 500])
def test_every_task_runs_once_on_a_slot_of_the_job(pool, tasks, threads):
    calls = run(pool, tasks, threads)
    assert sorted(index for index, _ in calls) == list(range(tasks))
    assert {slot for _, slot in calls} <= set(range(threads))


def test_the_pools_threads_take_tasks_while_the_caller_is_busy(pool):
    """A task on the caller holds it until a pool thread has run one: only the pool's threads can meanwhile. (The
    pool's thread, taking tasks from the back, may also take them all before the caller takes one.)"""
    for _ in range(20):
        pool_thread_ran, waits = threading.Event(), []

        def body(_index, slot, pool_thread_ran=pool_thread_ran, waits=waits):
            if slot == 0:
                waits.append(pool_thread_ran.wait(HANG_GUARD_S))
            else:
                pool_thread_ran.set()
        calls = run(pool, 16, 2, body)
        assert all(waits) and any(slot != 0 for _, slot in calls)


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_the_caller_takes_tasks_from_the_front_and_the_pools_threads_from_the_back(pool, threads):
    """Each end in order, so that each thread reads one stretch of a weight; whoever is faster takes more."""
    for _ in range(20):
        calls = run(pool, 300, threads, holding_task_0(threading.Event()))
        front = sorted(index for index, slot in calls if slot == 0)
        back = sorted((index for index, slot in calls if slot != 0), reverse=True)
        assert front == list(range(len(front))) and back == list(range(299, 299 - len(back), -1))
        assert len(front) + len(back) == 300 and back


def holding_task_0(later_task_ran: threading.Event):
    def body(index, _slot):
        if index == 0:
            assert later_task_ran.wait(HANG_GUARD_S), "no other thread took a task"
        else:
            later_task_ran.set()
    return body


def test_a_task_that_runs_a_job_runs_it_alone(pool):
    inner: list[list[tuple[int, int]]] = []
    outer = run(pool, 4, 2, lambda task, slot: inner.append(run(pool, 5, 2)))
    assert sorted(index for index, _ in outer) == [0, 1, 2, 3]
    assert [sorted(calls) for calls in inner] == [[(i, 0) for i in range(5)]] * 4


def test_callers_on_many_threads_each_get_their_own_tasks(pool):
    results: dict[int, list] = {}

    def caller(n):
        results[n] = sorted(index for index, _ in run(pool, 50 + n, 2))
    callers = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(HANG_GUARD_S)
    assert results == {n: list(range(50 + n)) for n in range(4)}


def test_the_counts_add_up_the_jobs_given_to_the_pool(pool):
    def counts():
        values = (ctypes.c_int64 * 4)()
        pool.swarm_pool_counts(values)
        return list(values)
    before = counts()
    for _ in range(3):
        run(pool, 10, 2)
    run(pool, 10, 1)   # one thread: the caller runs it alone
    after = counts()
    assert after[0] - before[0] == 3
    assert all(b >= a for a, b in zip(before, after))


def test_a_forked_child_runs_jobs_on_threads_of_its_own():
    script = f"""
import ctypes, os, threading
from kernels.cpu import native
TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int)
pool = native.load(native.POOL)
def job():   # task 0 holds its thread until a later task has run: True where one did
    later_task_ran, waited = threading.Event(), []
    def task(_context, index, slot):
        waited.append(later_task_ran.wait({HANG_GUARD_S})) if index == 0 else later_task_ran.set()
    pool.swarm_pool_run(TASK(task), None, 16, 2)
    return waited == [True]
assert job()
child = os.fork()
if child == 0:
    os._exit(0 if job() else 3)
_, status = os.waitpid(child, 0)
print(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=4 * HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"]
