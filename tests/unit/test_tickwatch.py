"""The tick watchdog logs a stalled tick thread once, with every thread's stack, and its length after."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from raftlog.tickwatch import TickWatch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_stalled_tick_is_logged_once_with_its_stack_and_its_length(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="raftlog.tickwatch")
    watch = TickWatch(stall_s=0.2)
    watch.start()
    resume = threading.Event()

    def ticker() -> None:  # ticks, then stalls inside a recognisable function, then ticks again
        for _ in range(5):
            watch.beat()
            time.sleep(0.02)

        def stuck_in_a_slow_fsync() -> None:
            resume.wait(5)

        stuck_in_a_slow_fsync()
        for _ in range(3):
            watch.beat()
            time.sleep(0.02)

    t = threading.Thread(target=ticker, name="tick")
    try:
        t.start()
        deadline = time.monotonic() + 5
        while watch.stalls == 0:
            assert time.monotonic() < deadline, "no stall reported"
            time.sleep(0.02)
        time.sleep(0.3)  # still stalled: reported once, not again
        resume.set()
        t.join(5)
    finally:
        watch.stop()
    stalls = [r for r in caplog.records if "has not ticked" in r.getMessage()]
    backs = [r for r in caplog.records if "is back after" in r.getMessage()]
    assert len(stalls) == 1 and len(backs) == 1 and watch.stalls == 1
    text = stalls[0].getMessage()
    assert "--- thread tick (the tick thread)" in text and "stuck_in_a_slow_fsync" in text
    assert text.index("(the tick thread)") < text.index("--- thread tick-watch")  # the tick thread first
    assert watch.longest_s >= 0.4


def test_no_tick_yet_is_no_stall() -> None:
    watch = TickWatch(stall_s=0.05)
    watch.start()
    time.sleep(0.2)  # the transport not up yet: nothing ticks, nothing to report
    watch.stop()
    assert watch.stalls == 0


def test_a_process_wide_pause_is_not_a_tick_stall() -> None:
    # SIGSTOP stops the watchdog too; when the process goes on, the tick thread is not to blame
    script = textwrap.dedent("""
        import sys, time
        from raftlog.tickwatch import TickWatch
        w = TickWatch(stall_s=0.3)
        w.start()
        print("ready", flush=True)
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            w.beat()
            time.sleep(0.02)
        w.stop()
        print("stalls", w.stalls, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(1.2)
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.strip() == "stalls 0", out
