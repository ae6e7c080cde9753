"""Record the fixture of this folder with the installed torch: run it in each venv.

    python tests/torch_traces/record_trace.py   # writes torch-<version>.trace.json.gz
                                                # and torch-<version>.table.txt here

One MLP train step in a ``record_function`` range, recorded by torch.profiler
with ``record_shapes`` and ``with_stack`` (so the trace has ``python_function``
events), and the table torch's own ``key_averages()`` printed for it.
test_torch_traces_by_version.py loads each trace and compares.
"""

import gzip
import os
import shutil

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    step()  # warm-up: lazy initialisation stays out of the trace
    with torch.profiler.profile(record_shapes=True, with_stack=True) as prof:
        with torch.profiler.record_function("my_step"):
            step()
    here = os.path.dirname(os.path.abspath(__file__))
    name = "torch-" + torch.__version__.split("+")[0]
    plain = os.path.join(here, name + ".trace.json")
    prof.export_chrome_trace(plain)
    with open(plain, "rb") as src, gzip.GzipFile(plain + ".gz", "wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(plain)
    with open(os.path.join(here, name + ".table.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=-1))


if __name__ == "__main__":
    main()
