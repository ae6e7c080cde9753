"""torch's launcher (``torch.distributed.run``) with its c10d stores listening on loopback only.

``opscope run --nproc-per-node N`` runs a single-host job. torchrun's TCP stores (the
rendezvous store and the one the ranks share, whose port is ``MASTER_PORT``) listen on
every interface (``*:PORT``), whatever ``--master-addr`` or ``--local-addr`` say: a
``TCPStore`` server binds the wildcard address unless it is handed a listening socket
(``master_listen_fd``). This file runs torch's own launcher, unchanged, with one
difference: a store server that this launcher process starts gets a socket bound to
127.0.0.1 on the port it asked for. Run it with ``--local-addr 127.0.0.1``, so the
ranks are told that address.

It runs as a file (``python -c RUN_FILE loopback_launcher.py ARGS``), never importing
opscope: ``import opscope`` acts on ``OPSCOPE_*`` variables, and the start-up hook
gives no agent to a process that runs a file of the opscope package.

Example::

    >>> bind_loopback(0)[1] > 0
    True
"""

import os
import runpy
import socket
import sys

LOOPBACK = "127.0.0.1"
ARG_NAMES = ("host_name", "port", "world_size", "is_master")


def bind_loopback(port: int) -> "tuple":
    """A listening socket's file descriptor on 127.0.0.1:``port`` (0: any free port), and
    its port; the caller owns the descriptor."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, int(port)))
        sock.listen(socket.SOMAXCONN)
        port = sock.getsockname()[1]
        return sock.detach(), port
    finally:
        sock.close()


def loopback_store_class(store_class: type) -> type:
    """A ``TCPStore`` subclass whose servers listen on loopback (clients are unchanged)."""

    class LoopbackTCPStore(store_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            named = dict(zip(ARG_NAMES, args))
            named.update(kwargs)
            if named.get("is_master") and named.get("master_listen_fd") is None:
                named["master_listen_fd"], named["port"] = bind_loopback(named.get("port", 0))
            super().__init__(**named)

    return LoopbackTCPStore


def main() -> None:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    store_class = loopback_store_class(dist.TCPStore)
    dist.TCPStore = store_class  # dynamic rendezvous' store for the ranks (dist.TCPStore)
    c10d_rendezvous_backend.TCPStore = store_class  # the rendezvous' own store
    sys.argv = [os.path.basename(__file__)] + sys.argv[1:]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
