"""A fork while an output file is being written: the child never touches the parent's file.

The parent's temp file and its offset are shared with a forked child. If the child flushed
its copy of the buffer, removed the temp file or published it, the parent's output would be
corrupt or gone. Each scenario runs in its own Python process with a timeout.
"""

from __future__ import annotations

from test_fork import run_script

ATOMIC_WRITE_ACROSS_FORK = """
    import gc, json, os, sys
    from opscope.files.atomic import atomic_text_writer

    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ["OUT"], "out.txt")
    with atomic_text_writer(path) as f:
        f.write("parent-before;")
        pid = os.fork()
        if pid == 0:
            # the child leaves the block with an error, then exits normally
            try:
                raise RuntimeError("child leaves the write")
            finally:
                pass
        os.waitpid(pid, 0)
        f.write("parent-after")
    folder = os.path.dirname(path)
    print(json.dumps({"content": open(path).read(), "files": sorted(os.listdir(folder))}))
"""


def test_child_leaving_an_inherited_write_does_not_touch_the_parents_file(tmp_path):
    script = ATOMIC_WRITE_ACROSS_FORK.replace('os.environ["OUT"]', repr(str(tmp_path)))
    result = run_script(script, "native", timeout=60)
    assert result == {"content": "parent-before;parent-after", "files": ["out.txt"]}


ET_ACROSS_FORK = """
    import gc, json, os, sys
    import torch
    import opscope
    from opscope.execution_trace.observer import load_execution_trace

    folder = os.environ["OUT"]
    path = os.path.join(folder, "et.json")
    et = opscope.ExecutionTraceObserver().register_callback(path)
    et.start()
    torch.ones(3).add(1)
    pid = os.fork()
    if pid == 0:
        for _ in range(1000):
            torch.ones(3).mul(2)
        del et
        gc.collect()
        sys.exit(0)  # a normal exit: finalizers run in the child
    os.waitpid(pid, 0)
    torch.ones(3).sub(1)
    et.stop()
    et.unregister_callback()
    names = [n["name"] for n in load_execution_trace(path)["nodes"]]
    print(json.dumps({"add": names.count("aten::add"), "sub": names.count("aten::sub"),
                      "mul": names.count("aten::mul"), "files": sorted(os.listdir(folder))}))
"""


def test_forked_child_leaves_the_parents_execution_trace_alone(tmp_path):
    script = ET_ACROSS_FORK.replace('os.environ["OUT"]', repr(str(tmp_path)))
    result = run_script(script, "native", timeout=300)
    assert result == {"add": 1, "sub": 1, "mul": 0, "files": ["et.json"]}
