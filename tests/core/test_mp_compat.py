"""Programs written for multiprocessing run unchanged with ``import fiber as
multiprocessing``: the examples of CPython's documentation, and output forwarding."""

from __future__ import annotations


def test_documentation_examples_run_unchanged(run_script):
    result = run_script(
        """
        import fiber as multiprocessing
        from fiber import Process, Queue, Pipe, Pool, JoinableQueue, SimpleQueue
        import os, time

        def f(x):
            return x*x

        def info(title):
            print(title, multiprocessing.current_process().name, flush=True)

        def fq(q):
            q.put([42, None, 'hello'])

        def fp(conn):
            conn.send([42, None, 'hello'])
            conn.close()

        def worker(q):
            while True:
                item = q.get()
                q.task_done()

        if __name__ == '__main__':
            multiprocessing.set_start_method('spawn')
            ctx = multiprocessing.get_context('spawn')
            with Pool(5) as p:
                print(p.map(f, [1, 2, 3]))
            p = Process(target=info, args=('function f',))
            p.start(); p.join()
            q = ctx.Queue()
            p = ctx.Process(target=fq, args=(q,))
            p.start(); print(q.get()); p.join()
            parent_conn, child_conn = Pipe()
            p = Process(target=fp, args=(child_conn,))
            p.start(); print(parent_conn.recv()); p.join()
            with Pool(processes=4) as pool:
                print(pool.map(f, range(10)))
                for i in pool.imap_unordered(f, range(3)):
                    pass
                res = pool.apply_async(f, (20,))
                print(res.get(timeout=10))
                res = pool.apply_async(os.getpid, ())
                print(isinstance(res.get(timeout=10), int))
                multiple_results = [pool.apply_async(os.getpid, ()) for i in range(4)]
                print(len([res.get(timeout=10) for res in multiple_results]))
                res = pool.apply_async(time.sleep, (10,))
                try:
                    print(res.get(timeout=1))
                except multiprocessing.TimeoutError:
                    print("We lacked patience and got a multiprocessing.TimeoutError")
            jq = JoinableQueue()
            w = Process(target=worker, args=(jq,), daemon=True); w.start()
            for item in range(5):
                jq.put(item)
            jq.join()
            print("All work completed", multiprocessing.cpu_count() >= 1)
            sq = SimpleQueue(); sq.put(1); print(sq.get(), sq.empty())
        """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [
        "[1, 4, 9]",
        "function f Process-6",  # the 5 pool workers took 1-5, as in multiprocessing
        "[42, None, 'hello']",
        "[42, None, 'hello']",
        "[0, 1, 4, 9, 16, 25, 36, 49, 64, 81]",
        "400",
        "True",
        "4",
        "We lacked patience and got a multiprocessing.TimeoutError",
        "All work completed True",
        "1 True",
    ], result.stdout


def test_child_output_reaches_parent_with_optional_prefix(run_script):
    code = """
        import sys, fiber
        def talk():
            print("to stdout")
            print("to stderr", file=sys.stderr)
        if __name__ == "__main__":
            p = fiber.Process(target=talk, name="talker"); p.start(); p.join()
        """
    plain = run_script(code)
    assert plain.returncode == 0 and "to stdout" in plain.stdout and "to stderr" in plain.stderr
    prefixed = run_script(code, env={"FIBER_OUTPUT_PREFIX": "true"})
    assert "[talker] to stdout" in prefixed.stdout
    assert "[talker] to stderr" in prefixed.stderr
