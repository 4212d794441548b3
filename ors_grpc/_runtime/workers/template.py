"""The template process of `--isolation episode`: imports the environments
once, then forks a worker process per request (`hop.Fork`, answered
`hop.Forked`) and reports how each child ended (`hop.Exited`), which only a
parent can learn. Started as `python -m ors_grpc._runtime.workers.template
CONTROL_FD SERVER_PID`; it talks to the server over CONTROL_FD (a socket
pair) with blocking frames.

No event loop, no thread and no grpc ever run here: a fork copies only the
forking thread, so whatever another thread held would stay held in the
child. `gc.freeze` after the imports keeps the children's collections off
the template's objects, so their pages stay shared. It dies with the server
and its children with it (PR_SET_PDEATHSIG): docs/workers.md.
"""

from __future__ import annotations

import gc
import logging
import os
import selectors
import signal
import socket
import sys
import threading
import traceback
from typing import NoReturn

from ors_grpc._runtime.workers import worker
from ors_grpc._runtime.workers.hop import Exited, Fork, Forked, Ready, Setup, recv_frame, send_frame
from ors_grpc.observability.log_lines import configure_logging

logger = logging.getLogger("ors_grpc.template")


def main() -> None:
    control_fd, server_pid = int(sys.argv[1]), int(sys.argv[2])
    worker.die_with_parent(server_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server decides
    gc.disable()  # no collection until the freeze: holes freed meanwhile would be pages the children copy
    control = socket.socket(fileno=control_fd)
    setup: Setup = recv_frame(control)
    sys.path[:] = setup.sys_path
    configure_logging(setup.log_level, worker="template", force=True)
    try:
        for spec in [*setup.environments.values(), *setup.toolsets]:
            worker.load(spec)
    except BaseException:
        send_frame(control, Ready(error=traceback.format_exc()))
        return
    threads = [thread.name for thread in threading.enumerate() if thread is not threading.current_thread()]
    if threads:
        logger.warning("template_has_threads names=%s (started at import: a forked episode process gets none of "
                       "them, and whatever they held stays held there)", ",".join(threads))
    gc.freeze()
    send_frame(control, Ready())
    _serve_forks(control)
    os._exit(0)  # the server closed the control socket: the children go with this process


def _serve_forks(control: socket.socket) -> None:
    """Fork on each request; report each child's end. Returns when the server closes the socket."""
    woken_r, woken_w = os.pipe()
    os.set_blocking(woken_w, False)
    # A handler (SIG_IGN would have the kernel reap children unseen): it does nothing, the wakeup fd says "reap".
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(woken_w, warn_on_full_buffer=False)
    template_pid = os.getpid()
    with selectors.DefaultSelector() as selector:
        selector.register(control, selectors.EVENT_READ)
        selector.register(woken_r, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is control:
                    try:
                        fork: Fork = recv_frame(control)
                    except (EOFError, ConnectionError):
                        return
                    pid = os.fork()
                    if pid == 0:
                        _become_worker(fork, template_pid, [control, selector], [woken_r, woken_w])
                    send_frame(control, Forked(fork.worker_id, pid))
                else:
                    os.read(woken_r, 4096)
                    _report_exits(control)


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send_frame(control, Exited(pid, os.waitstatus_to_exitcode(status)))


def _become_worker(
    fork: Fork, template_pid: int, template_files: list[socket.socket | selectors.BaseSelector], template_fds: list[int],
) -> NoReturn:
    """In the child: drop what is the template's, and serve as a worker (never returning into the loop above)."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for file in template_files:
            file.close()  # a selector's close only closes its own descriptor: the template's stays as it was
        for fd in template_fds:
            os.close(fd)
        gc.enable()
        worker.run(fork.socket_path, fork.worker_id, template_pid)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(1)


if __name__ == "__main__":
    main()
