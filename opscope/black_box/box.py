"""``opscope.blackbox``: always on, it keeps the last seconds of every op and writes them
when something goes wrong.

While it runs, the native collector records every op, user range (and,
if asked, module range, input shapes, stacks and allocations) on every
thread into short consecutive windows; the ring (``black_box.ring``) keeps
the last ``seconds`` of them within ``max_mb``. A window closes when it is a
quarter of ``seconds`` old or holds a quarter of ``max_mb``; a monitor
thread checks 20 times a second. A dump closes the live window, hands the
ring's windows to a thread that builds and writes the trace
(``black_box.dump``), and the job goes on. The moments that dump:
``exception`` (any thread), ``signal`` (SIGTERM, SIGINT: written first,
then the signal does what it did), ``slow_step``, ``stall``
(``black_box.triggers``), and ``manual`` (``dump()``).

An ``opscope.profile`` started meanwhile takes the collector over; when it
stops, its records join the ring, so neither loses an op. In a forked child
(a DataLoader worker) the black box is gone, unless made with ``follow_fork``: then
the child starts its own, with an empty ring (``black_box.registry``).

Example::

    >>> import os, tempfile, torch, opscope
    >>> folder = tempfile.mkdtemp()
    >>> with opscope.blackbox(dir=folder, seconds=5) as box:
    ...     _ = torch.ones(3) + 1
    ...     path = box.dump(wait=True)
    >>> os.path.basename(path).split(".")[1:3]
    ['blackbox', 'manual']
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any, Callable, Dict, Optional

from opscope.arguments import check_bool, check_path, check_positive
from opscope.black_box import registry
from opscope.black_box.dump import REASONS, dump_path, script_name, write_dump
from opscope.black_box.fatal import FatalDump
from opscope.black_box.job import JobDumps, post_dump
from opscope.black_box.ring import Ring
from opscope.black_box.triggers import Hooks, StepWatch
from opscope.collect.recording import Recording
from opscope.api.options import complete_distributed_info, torchrun_env_info
from opscope.record_function import set_recording_collector
from opscope.step_tracker import StepTracker, track_optimizer_steps

WINDOWS_PER_RING = 4
TICK_S = 0.05  # the monitor's period: at a million ops a second a window grows 3 MB in it
MIN_DUMP_GAP_S = 1.0  # between two dumps that are not the job's last (rate limit)
OPTION_NAMES = ("record_shapes", "profile_memory", "with_stack", "with_modules")


class blackbox:  # noqa: N801 - named as opscope.profile is
    """A bounded recording of the last ``seconds`` of every op, written on trouble."""

    def __init__(self, dir: str = "opscope-blackbox", seconds: float = 30,  # noqa: A002
                 max_mb: float = 64, slow_step: float = 3.0, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False,
                 with_modules: bool = False, follow_fork: bool = False):
        self.dir = check_path("blackbox", "dir", dir)
        self.seconds = check_positive("blackbox", "seconds", seconds)
        self.max_mb = check_positive("blackbox", "max_mb", max_mb)
        self.slow_step = check_positive("blackbox", "slow_step", slow_step)
        if self.slow_step <= 1:
            raise ValueError(f"blackbox: slow_step must be above 1 (a multiple of the median "
                             f"step), got {slow_step!r}")
        self.options = {name: check_bool("blackbox", name, value) for name, value in zip(
            OPTION_NAMES, (record_shapes, profile_memory, with_stack, with_modules))}
        self.follow_fork = check_bool("blackbox", "follow_fork", follow_fork)
        self._lock = threading.RLock()
        self._ring = Ring(self.seconds, int(self.max_mb * 2 ** 20))
        self._collector: Any = None
        self._window: Optional[Recording] = None
        self._window_start = (0, 0, 0)  # (monotonic ns, bytes taken, collector ns) at start
        self._paused = False  # an opscope.profile holds the collector
        self._paused_at = 0.0
        self._running = False
        self._owner = os.getpid()
        self._stop_event = threading.Event()
        self._monitor: Optional[threading.Thread] = None
        self._writers: list = []
        self._last_dump = -1e18
        self._watch = StepWatch(self.slow_step)
        self._hooks = Hooks(self._final_dump)
        self._listener: Optional[int] = None
        self._job: Optional[JobDumps] = None
        self._fatal: Optional[FatalDump] = None  # a crash writes the ring raw
        self.dumps: list = []  # paths written (or being written), in order
        self._folder = os.path.abspath(self.dir)
        self.script: Optional[str] = None  # the name dumps take (None: sys.argv[0])
        self.yields = False  # True: a black box the script starts itself replaces this one

    # -- start and stop -----------------------------------------------------------------
    def __enter__(self) -> "blackbox":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Begin keeping the last ``seconds``; a job without the native collector goes on
        with one warning line and no black box."""
        if self._running:
            raise RuntimeError("opscope.blackbox: already running; stop() it first")
        from opscope.collect import choose_collector

        collector = choose_collector()
        if collector.name != "native":
            warnings.warn("opscope: the black box needs the native collector; it is off",
                          RuntimeWarning, stacklevel=2)
            return
        registry.claim(self)
        self._collector, self._running, self._owner = collector, True, os.getpid()
        self.script = script_name(self.script)  # the script's, as it is now
        self._folder = os.path.abspath(self.dir)  # where the job runs now
        rank = torchrun_env_info()
        if rank is not None and ".rank" not in self.script:
            self.script += f".rank{rank['rank']}"  # one folder holds every rank's dumps
        self._stop_event.clear()
        with self._lock:
            self._paused = collector.is_recording()  # a profile runs: join at its stop
            self._paused_at = time.monotonic()
            if not self._paused:
                self._open_window()
        self._hooks.install()
        track_optimizer_steps()
        self._listener = StepTracker.add_listener(self._on_step)
        self._job = JobDumps(self._dump_for_job)
        self._job.start()
        self._fatal = FatalDump(collector)
        self._fatal.install(self._folder, self.script)
        self._register_fatal()
        self._monitor = threading.Thread(target=self._watch_loop, name="opscope-blackbox",
                                         daemon=True)
        self._monitor.start()

    def stop(self) -> None:
        """Stop keeping; dumps being written are finished first. What was kept is dropped."""
        if not self._running or os.getpid() != self._owner:
            return
        self._running = False
        self._stop_event.set()
        self._hooks.uninstall()
        if self._job is not None:
            self._job.stop()
        if self._fatal is not None:
            self._fatal.uninstall()
        if self._listener is not None:
            StepTracker.remove_listener(self._listener)
            self._listener = None
        if self._monitor is not None:
            self._monitor.join()
        with self._lock:
            window, self._window = self._window, None
            if window is not None:
                window.discard()
        for writer in list(self._writers):
            writer.join()
        self._ring.clear()
        registry.release(self)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def owner(self) -> int:
        """The process the black box records in (a forked child is not it)."""
        return self._owner

    def drop_after_fork(self) -> None:
        """In a forked child: this black box is the parent's; nothing of it runs here."""
        self._running = False
        window, self._window = self._window, None
        if window is not None:
            window.forget_after_fork()  # its probes' hooks are the parent's
        if self._fatal is not None:
            self._fatal.uninstall()  # a crash here writes nothing of the parent's
        self._lock = threading.RLock()

    def again_in_child(self) -> None:
        """``follow_fork``: the same settings, an empty ring, in this child."""
        try:
            blackbox(self.dir, self.seconds, self.max_mb, self.slow_step,
                     follow_fork=True, **self.options).start()
        except Exception as exc:  # noqa: BLE001 - never harm the child
            warnings.warn(f"opscope: no black box in the forked child: {exc}",
                          RuntimeWarning, stacklevel=1)

    # -- windows ------------------------------------------------------------------------
    def _open_window(self) -> None:
        window = Recording(self._collector, record_shapes=self.options["record_shapes"],
                           profile_memory=self.options["profile_memory"],
                           with_stack=self.options["with_stack"],
                           with_modules=self.options["with_modules"],
                           metadata={name: "1" for name, on in self.options.items() if on},
                           wire=set_recording_collector)
        window.start()
        self._window_start = (time.monotonic_ns(), self._collector.taken_bytes(),
                              self._collector.now_ns())
        self._window = window  # after its start: _live_bytes() reads both unlocked
        self._register_fatal()

    def _close_window(self) -> None:
        """Stop the live window into the ring (called with the lock held)."""
        window, self._window = self._window, None
        if window is not None:
            # room for the next window, which grows to a quarter of max_mb before it closes
            self._ring.add(window.stop(), time.monotonic_ns(),
                           live_bytes=int(self.max_mb * 2 ** 20 / WINDOWS_PER_RING))

    def _register_fatal(self) -> None:
        """Tell the crash handler the ring's windows as they are now."""
        if self._fatal is not None:
            self._fatal.register(self._ring.windows(), self._window_start[2])

    def _rotate(self) -> None:
        with self._lock:
            if self._window is None or self._paused:
                return
            self._close_window()
            self._open_window()

    def _live_bytes(self) -> int:
        if self._window is None:
            return 0
        return self._collector.taken_bytes() - self._window_start[1]

    def pause(self) -> None:
        """An opscope.profile takes the collector: close the window, record nothing."""
        with self._lock:
            if self._running and not self._paused:
                self._close_window()
                self._paused, self._paused_at = True, time.monotonic()
                self._register_fatal()

    def resume(self, raw) -> None:
        """The profile stopped: its records (``raw``) join the ring; recording goes on."""
        with self._lock:
            if not (self._running and self._paused):
                return
            if raw is not None:
                self._ring.add(raw, time.monotonic_ns())
            self._paused = False
            try:
                self._open_window()
            except Exception as exc:  # noqa: BLE001 - never harm the job
                warnings.warn(f"opscope: the black box stopped recording: {exc}",
                              RuntimeWarning, stacklevel=2)

    def _watch_loop(self) -> None:
        quarter_ns = self.seconds * 1e9 / WINDOWS_PER_RING
        quarter_bytes = self.max_mb * 2 ** 20 / WINDOWS_PER_RING
        registered = -1
        while not self._stop_event.wait(min(TICK_S, self.seconds / 8)):
            try:
                if self._window is not None and not self._paused and (
                        time.monotonic_ns() - self._window_start[0] >= quarter_ns
                        or self._live_bytes() >= quarter_bytes):
                    self._rotate()
                if (self._paused and time.monotonic() - self._paused_at > 1.0
                        and not self._collector.is_recording()):
                    self.resume(None)  # the profile's window was dropped, not stopped
                with self._lock:
                    self._ring.trim(time.monotonic_ns(), self._live_bytes())
                    if self._ring.version != registered:
                        registered = self._ring.version
                        self._register_fatal()
                stall = self._watch.stalled()
                if stall is not None:
                    self.dump("stall", facts=stall)
            except Exception as exc:  # noqa: BLE001 - never harm the job
                warnings.warn(f"opscope: the black box's monitor stopped: {exc}",
                              RuntimeWarning, stacklevel=1)
                return

    def _on_step(self, _step: int) -> None:
        slow = self._watch.on_step()
        if slow is not None:
            self.dump("slow_step", facts=slow)

    # -- dumps --------------------------------------------------------------------------
    def dump(self, reason: str = "manual", *, wait: bool = False,
             facts: Optional[Dict[str, Any]] = None,
             on_done: Optional[Callable[[Optional[str], str], None]] = None) -> Optional[str]:
        """Write the ring now; returns the file's path (written by a background thread
        unless ``wait``), or None when skipped (not running, or a dump less than a
        second ago). ``on_done(path, problem)`` is called once it is written (path), or
        failed or skipped (None, why)."""
        if reason not in REASONS:
            raise ValueError(f"blackbox.dump: reason must be one of {', '.join(REASONS)}, "
                             f"got {reason!r}")
        done = on_done or _nothing
        if not self._running or os.getpid() != self._owner:
            done(None, "the black box is not running")
            return None
        now = time.monotonic()
        from_job = "origin_rank" in (facts or {})
        if now - self._last_dump < MIN_DUMP_GAP_S and not wait:
            why = f"skipped: a dump was written less than {MIN_DUMP_GAP_S:g} s ago"
            if not from_job:  # another rank's post of the same moment: nothing to say
                warnings.warn(f"opscope: black box dump ({reason}) {why}", RuntimeWarning,
                              stacklevel=2)
            done(None, why)
            return None
        self._last_dump = now
        if not from_job:
            self._tell_other_ranks(reason)
        with self._lock:
            if not self._paused:
                self._close_window()
            windows = self._ring.windows()
            if not self._paused and self._running:
                self._open_window()
        path = dump_path(self._folder, reason, script=self.script)
        info = dict(facts or {}, reason=reason, dump_ns=time.monotonic_ns(),
                    seconds=self.seconds, max_mb=self.max_mb)
        info["metadata"] = {}
        complete_distributed_info(info["metadata"], final=True)  # the rank, for `ranks`
        self.dumps.append(path)
        if wait:
            return self._write(windows, path, info, done)
        writer = threading.Thread(target=self._write, args=(windows, path, info, done),
                                  name="opscope-blackbox-dump")
        self._writers.append(writer)
        writer.start()
        return path

    def _write(self, windows, path: str, info: Dict[str, Any],
               done: Callable[[Optional[str], str], None]) -> Optional[str]:
        try:
            written = write_dump(windows, path, info, self.options, self.seconds)
        except Exception as exc:  # noqa: BLE001 - a dump never harms the job: one line
            text = " ".join(str(exc).split())[:300]
            warnings.warn(f"opscope: black box dump not written ({info['reason']}): "
                          f"{path}: {text}", RuntimeWarning, stacklevel=2)
            done(None, f"not written: {text}")
            return None
        finally:
            me = threading.current_thread()
            self._writers = [w for w in self._writers if w is not me]
        done(written, "")
        return written

    def _tell_other_ranks(self, reason: str) -> None:
        """On a multi-rank job, every other rank dumps the same moment (``black_box.job``)."""
        try:
            post_dump(reason)
        except Exception as exc:  # noqa: BLE001 - this rank's dump goes on
            warnings.warn(f"opscope: the other ranks were not asked to dump: "
                          f"{' '.join(str(exc).split())[:200]}", RuntimeWarning, stacklevel=3)

    def _dump_for_job(self, reason: str, facts: Dict[str, Any]) -> None:
        self.dump(reason, facts=facts)

    def _final_dump(self, reason: str, facts: Dict[str, Any]) -> None:
        """An exception or a signal: write at once, on this thread, and wait."""
        try:
            self.dump(reason, wait=True, facts=facts)
        except Exception:  # noqa: BLE001 - the job's own ending comes first
            pass


def _nothing(_path: Optional[str], _why: str) -> None:
    """The default ``on_done``."""
