"""The one exit path of a fiber process (fiber.util.at_exit): steps run by priority,
once each, whatever the import order; a program registers only the steps it needs."""

from __future__ import annotations


def test_steps_run_highest_priority_first_once_each(run_script):
    result = run_script("""
        from fiber import util

        util.at_exit("low", 1, lambda: print("low", flush=True))
        util.at_exit("high", 90, lambda: print("high", flush=True))
        util.at_exit("broken", 50, lambda: 1 / 0)
        util.at_exit("mid", 40, lambda: print("mid-old", flush=True))
        util.at_exit("mid", 40, lambda: print("mid", flush=True))  # replaces the first
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["high", "mid", "low"]  # the raising step is skipped
    assert "Traceback" not in result.stderr


def test_a_program_that_starts_nothing_registers_no_exit_step(run_script):
    result = run_script("""
        import fiber
        from fiber import util

        fiber.get_context()
        fiber.get_config_value("backend")
        # private read: the exit steps registered (no API lists them)
        print(sorted(util._callbacks))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_steps_of_a_program_with_a_child_and_a_queue(run_script):
    """The order the architecture page gives: children joined before the mailboxes drop
    their items, connections closed last; each step ran (seen at exit)."""
    result = run_script("""
        import fiber
        from fiber import util

        def child(q):
            q.put("from the child")

        if __name__ == "__main__":
            q = fiber.Queue()
            p = fiber.Process(target=child, args=(q,))
            p.start()
            print(q.get(timeout=60), flush=True)
            # private read: the exit steps and their order (no API lists them)
            steps = sorted(util._callbacks.items(), key=lambda item: -item[1][0])
            print(" ".join(name for name, _ in steps), flush=True)
            for name, (priority, step) in list(util._callbacks.items()):
                def traced(name=name, step=step):
                    print("exit:" + name, flush=True)
                    step()
                util.at_exit(name, priority, traced)
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "from the child"
    # (run records: the run's record for fiber clean, removed after the children)
    assert lines[1] == "children local logs mailboxes run records connections"
    assert lines[2:] == ["exit:children", "exit:local logs", "exit:mailboxes",
                         "exit:run records", "exit:connections"]
