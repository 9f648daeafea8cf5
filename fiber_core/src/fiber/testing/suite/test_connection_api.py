"""``fiber.connection`` across jobs of the selected backend: a ``Listener`` in the
parent reached by a ``Client`` in a job and the other way round (default address and
key: where the backend's jobs can reach, and the run's secret), and
``Connection.fileno()``/``wait()`` on a pipe end whose mailbox lives in a job."""

from __future__ import annotations

import time

import fiber
from fiber.connection import Client, Listener, Pipe, wait


def call_back(address, message):
    with Client(address) as conn:
        conn.send(message)
        return conn.recv()


def client_job(address, out):
    out.send(call_back(address, "from the job"))


def serve_once(report):
    with Listener() as listener:
        report.send(listener.address)
        with listener.accept() as conn:
            conn.send(("served", conn.recv()))


def hand_out_an_end(report, go):
    """Make a pipe in this job, give the parent its reading end, send on "go"."""
    mine, theirs = Pipe()
    report.send(theirs)
    for message in iter(go.recv, None):
        mine.send(message)
    mine.close()
    go.recv()  # keep the mailbox until the parent is done


def test_client_in_a_job_reaches_a_listener_here():
    out_r, out_w = Pipe(duplex=False)
    with Listener() as listener:
        job = fiber.Process(target=client_job, args=(listener.address, out_w))
        job.start()
        with listener.accept() as conn:
            assert conn.recv() == "from the job"
            conn.send("answer")
        assert out_r.poll(120) and out_r.recv() == "answer"
    job.join(60)
    assert job.exitcode == 0


def test_listener_in_a_job_reached_from_here():
    report_r, report_w = Pipe(duplex=False)
    job = fiber.Process(target=serve_once, args=(report_w,))
    job.start()
    assert report_r.poll(120), "the job did not report its listener's address"
    address = report_r.recv()
    assert call_back(address, "hello") == ("served", "hello")
    job.join(60)
    assert job.exitcode == 0


def test_wait_on_an_end_whose_mailbox_is_in_a_job():
    report_r, report_w = Pipe(duplex=False)
    go_r, go_w = Pipe(duplex=False)
    job = fiber.Process(target=hand_out_an_end, args=(report_w, go_r))
    job.start()
    try:
        assert report_r.poll(120)
        end = report_r.recv()
        assert wait([end], 0.2) == []  # nothing sent yet
        go_w.send("one")
        assert wait([end], 60) == [end]
        assert end.recv() == "one"
        # level-triggered: readable while a message waits, not after it was taken
        deadline = time.monotonic() + 10
        while wait([end], 0.05) and time.monotonic() < deadline:
            pass
        assert wait([end], 0.2) == []
        go_w.send(None)  # the job closes its end: EOF makes the end readable
        assert wait([end], 60) == [end]
        try:
            end.recv()
        except EOFError:
            pass
        else:
            raise AssertionError("no EOF after the job closed its end")
        end.close()
        go_w.send("done")
    finally:
        job.join(60)
    assert job.exitcode == 0
