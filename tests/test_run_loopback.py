"""``opscope run --nproc-per-node`` keeps the job's c10d store on loopback (issue 28, finding 7).

torchrun's stores listen on every interface (``*:MASTER_PORT``) even with
``--master-addr 127.0.0.1``; ``opscope run`` launches torch's launcher so that they
listen on 127.0.0.1 only. Rank 0 of a real 2-rank job reads the kernel's table of
listening sockets (/proc/net/tcp, tcp6) for ``MASTER_PORT`` while the store serves.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap

from opscope.cli import loopback_launcher
from subprocesses import run_in_group
from test_run_distributed import job_env

WORKER = textwrap.dedent('''
    import json, os, socket, sys
    import torch.distributed as dist

    def listeners(port):
        """The local addresses listening on ``port`` (state 0A), as text."""
        found = []
        for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
            try:
                lines = open(table).read().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                address, hex_port = fields[1].split(":")
                if fields[3] == "0A" and int(hex_port, 16) == port:
                    raw = bytes.fromhex(address)
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    found.append(socket.inet_ntop(family, words))
        return sorted(found)

    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        port = int(os.environ["MASTER_PORT"])
        with open(sys.argv[1], "w") as f:
            json.dump({"master_addr": os.environ["MASTER_ADDR"], "listeners": listeners(port)}, f)
    dist.barrier()
    dist.destroy_process_group()
''')


def test_the_jobs_store_listens_on_loopback_only(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    seen = tmp_path / "seen.json"
    done = run_in_group([sys.executable, "-m", "opscope", "run", "--nproc-per-node", "2",
                         "-o", str(tmp_path / "out"), str(tmp_path / "worker.py"), str(seen)],
                        timeout=240, env=job_env(), cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(seen.read_text())
    assert found == {"master_addr": "127.0.0.1", "listeners": ["127.0.0.1"]}


def test_a_store_server_gets_a_loopback_socket_and_a_client_none():
    made = []

    class Store:
        def __init__(self, **named):
            made.append(named)

    store_class = loopback_launcher.loopback_store_class(Store)
    store_class("localhost", 0, is_master=True, multi_tenant=True)
    store_class(host_name="127.0.0.1", port=29500, is_master=False)
    server, client = made
    fd = server.pop("master_listen_fd")
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            assert sock.getsockname() == ("127.0.0.1", server["port"]) and server["port"] > 0
    finally:
        os.close(fd)
    assert server == {"host_name": "localhost", "port": server["port"], "is_master": True,
                      "multi_tenant": True}
    assert client == {"host_name": "127.0.0.1", "port": 29500, "is_master": False}
