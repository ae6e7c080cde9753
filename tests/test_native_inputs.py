"""The native observer's input encoding (record_shapes) on inputs outside the common case.

The observer writes an op's inputs into room reserved for tensors of up to five
dims and short int lists, tells lists apart by their element type, and reads
bool lists and doubles in place (observer/inputs.h, encode_inputs). These ops reach
every other branch: a tensor of seven dims, a list of 13 ints, tensor, bool,
float and optional-tensor lists, a string, doubles and a sparse tensor. The
expected values are what the observer wrote before its encoding was rewritten
(issue 19), which the exported trace must still hold.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import opscope
from opscope.collect import COLLECTOR_ENV


def exotic_ops() -> None:
    x7 = torch.randn(1, 2, 1, 2, 1, 2, 3)
    x = torch.randn(4, 8)
    img = torch.randn(1, 2, 5, 5, requires_grad=True)
    w = torch.randn(3, 2, 3, 3, requires_grad=True)
    torch.permute(x7, (6, 5, 4, 3, 2, 1, 0))
    torch.zeros([1] * 13)
    torch.cat([x, x, x], dim=0)
    torch.nn.functional.conv2d(img, w, padding=1).sum().backward()  # output_mask: bools
    torch.tensor([1.5, 2.5]).clamp(min=0.1, max=2.0)
    torch.linalg.vector_norm(x, 2.0, [0, 1], False)
    torch.index_put(torch.zeros(5), (torch.tensor([1, 3]),), torch.tensor([1.0, 2.0]))
    torch.nn.functional.interpolate(img.detach(), scale_factor=[1.5, 1.5], mode="nearest")
    torch.einsum("ij,jk->ik", x, x.t())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), (3,)).coalesce()


EXPECTED = {  # name -> (Input Dims, Input type, Input Strides, Concrete Inputs)
    "aten::permute": ([[1, 2, 1, 2, 1, 2, 3], []], ["float", "ScalarList"],
                      [[24, 12, 12, 6, 6, 3, 1], []], ["", "[6, 5, 4, 3, 2, 1, 0]"]),
    "aten::zeros": ([[], [], [], [], []], ["ScalarList", "", "", "", "Scalar"],
                    [[], [], [], [], []], ["[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]", "", "", "",
                                           "False"]),
    "aten::zero_": ([[1] * 13], ["float"], [[1] * 13], [""]),
    "aten::cat": ([[], []], ["TensorList", "Scalar"], [[], []], ["", "0"]),
    "aten::convolution_backward": (
        [[1, 3, 5, 5], [1, 2, 5, 5], [3, 2, 3, 3], [], [], [], [], [], [], [], []],
        ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "ScalarList",
         "Scalar", "ScalarList", "Scalar", "ScalarList"],
        [[0, 0, 0, 0], [50, 25, 5, 1], [18, 9, 3, 1], [], [], [], [], [], [], [], []],
        ["", "", "", "[0]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[1, 1, 0]"]),
    "aten::clamp": ([[2], [], []], ["float", "Scalar", "Scalar"], [[1], [], []], ["", "0.1", "2.0"]),
    "aten::linalg_vector_norm": ([[4, 8], [], [], [], []],
                                 ["float", "Scalar", "ScalarList", "Scalar", ""],
                                 [[8, 1], [], [], [], []], ["", "2.0", "[0, 1]", "False", ""]),
    "aten::index_put": ([[5], [], [2], []], ["float", "", "float", "Scalar"],
                        [[1], [], [1], []], ["", "", "", "False"]),
    "aten::upsample_nearest2d": ([[1, 2, 5, 5], [], []], ["float", "", ""],
                                 [[50, 25, 5, 1], [], []], ["", "", ""]),
    "aten::einsum": ([[], [], []], ["String", "TensorList", ""], [[], [], []], ["", "", ""]),
    "aten::coalesce": ([[3]], ["float"], [[0]], [""]),
}
KEYS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")


@pytest.fixture(scope="module")
def first_of_each(tmp_path_factory):
    """The first event of each op name, recorded by the native observer."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(COLLECTOR_ENV, "native")
        exotic_ops()  # warm-up: names interned, the fast path taken from the first op on
        with opscope.profile(record_shapes=True) as prof:
            exotic_ops()
    path = tmp_path_factory.mktemp("inputs") / "trace.json"
    prof.export_chrome_trace(str(path))
    found = {}
    for event in json.loads(path.read_text())["traceEvents"]:
        if event.get("cat") == "cpu_op" and event["name"] not in found:
            found[event["name"]] = tuple(event["args"].get(k) for k in KEYS)
    return found


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inputs_outside_the_common_case(first_of_each, name):
    assert first_of_each[name] == tuple(EXPECTED[name])


def test_ops_wider_than_the_reserved_room_across_chunks(native_only):
    """Ops whose inputs take more words than their common-case room (three tensors of seven
    dims, a 13-int list), thousands of times: the encoded inputs span several chunks of
    words (256k each) and every op's inputs are read back whole."""
    x7 = torch.randn(1, 2, 1, 2, 1, 2, 3)
    with opscope.profile(record_shapes=True) as prof:
        for _ in range(10_000):
            torch.addcmul(x7, x7, x7, value=0.5)
            torch.zeros([1] * 13)
    addcmul = [e for e in prof.events() if e.name == "aten::addcmul"]
    zeros = [e for e in prof.events() if e.name == "aten::zeros"]
    assert len(addcmul) == len(zeros) == 10_000
    dims = [1, 2, 1, 2, 1, 2, 3]
    assert all(e.input_shapes == [dims, dims, dims, []] for e in addcmul)
    assert all(e.input_shapes[0] == [] and len(e.input_shapes) == 5 for e in zeros)


def test_the_fast_path_is_found_on_this_torch(native_only):
    """on_start_fast reads two private fields of at::RecordFunction at offsets found on a
    probe object; where either is not found, every op takes the slower general path and the
    results stay right, so only this test notices. Run on each torch of the version matrix
    (bench/compat.py). After ops of both kinds (operators, and autograd's ranges with names
    of their own) the variant index is confirmed, so those ranges take the fast path too."""
    from opscope.collect.native.build import load_native

    x = torch.randn(4, 4, requires_grad=True)
    with opscope.profile():
        (x * 2).sum().backward()
    state = load_native().fast_path_state()
    assert state["own_name_offset"] >= 0 and state["async_offset"] >= 0, state
    assert state["variant_index_confirmed"], state


class CustomStrides(torch.Tensor):
    """A wrapper subclass whose strides come from Python (sizes/strides policy "strides"):
    TensorImpl::strides() calls into __torch_dispatch__, which answers (5, 7)."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(),
                                                   dtype=elem.dtype,
                                                   dispatch_sizes_strides_policy="strides")

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.stride.default:
            return (5, 7)
        unwrap = lambda t: t.elem if isinstance(t, CustomStrides) else t  # noqa: E731
        # A range around the inner op: an op whose only child has its own name is folded
        # into it (as torch's EventList does), and torch up to 2.8 names no range here.
        with torch.profiler.record_function("inner"):
            return func(*[unwrap(a) for a in args],
                        **{k: unwrap(v) for k, v in (kwargs or {}).items()})


def common_case_tensors():
    """aten::add on tensors of 0 to 6 dims, views with strides of their own (a transpose, an
    expand, channels-last, a step slice), another dtype, and a subclass whose strides
    Python computes: the common case copies torch's inline words whole, the rest go through
    TensorImpl's accessors."""
    base = torch.randn(2, 3, 4, 5, 6)
    tensors = [torch.tensor(1.5), torch.randn(3), torch.randn(2, 3), torch.randn(2, 3, 4),
               torch.randn(2, 3, 4, 5), base, torch.randn(1, 2, 1, 2, 1, 2),
               torch.randn(3, 4).t(), torch.randn(3, 1).expand(3, 4),
               torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
               base[:, ::2, 1:, :, ::3], torch.ones(2, 3, dtype=torch.int16),
               CustomStrides(torch.ones(2, 3))]
    for t in tensors:
        torch.add(t, 1)


def add_inputs(trace_path) -> list:
    events = json.loads(trace_path.read_text())["traceEvents"]
    return [tuple(json.dumps(e["args"].get(k)) for k in KEYS) for e in events
            if e.get("cat") == "cpu_op" and e["name"] == "aten::add"]


def test_common_case_tensors_match_torch_profiler(native_only, tmp_path):
    """Input dims, types and strides of each aten::add, as torch.profiler records them."""
    common_case_tensors()  # warm-up
    with torch.profiler.profile(record_shapes=True) as theirs:
        common_case_tensors()
    theirs.export_chrome_trace(str(tmp_path / "torch.json"))
    with opscope.profile(record_shapes=True) as ours:
        common_case_tensors()
    ours.export_chrome_trace(str(tmp_path / "opscope.json"))
    expected = add_inputs(tmp_path / "torch.json")
    assert len(expected) == 14  # the subclass's add runs an inner add on its element
    assert '[[5, 7], [], []]' in [strides for _, _, strides, _ in expected]
    assert add_inputs(tmp_path / "opscope.json") == expected


def membarrier_supported() -> bool:
    """Whether this kernel offers the private expedited membarrier (asked with ctypes)."""
    import ctypes
    import platform

    number = {"x86_64": 324, "aarch64": 283}.get(platform.machine())
    if number is None:
        return False
    commands = ctypes.CDLL(None, use_errno=True).syscall(number, 0, 0, 0)  # MEMBARRIER_CMD_QUERY
    return commands > 0 and bool(commands & (1 << 3))  # MEMBARRIER_CMD_PRIVATE_EXPEDITED


def test_stop_fences_the_fast_path_with_membarrier_where_the_kernel_has_it(native_only):
    """Where the kernel has membarrier, on_start_fast publishes its busy flag with a plain
    store and stop() makes every thread fence (an asymmetric Dekker handshake)."""
    from opscope.collect.native.build import load_native

    with opscope.profile():
        torch.ones(2).add(1)
    state = load_native().fast_path_state()
    if not membarrier_supported():
        pytest.skip("this kernel (or its sandbox) has no private expedited membarrier")
    assert state["light_fence"], state


@pytest.mark.parametrize("record_shapes", [False, True])
def test_sessions_stopping_under_busy_threads_keep_whole_records(native_only, record_shapes):
    """Three threads run ops without pause while 40 sessions start and stop: each stop
    waits for the records being written (the handshake), so every recorded op has its
    name, its inputs and an end no earlier than its start."""
    import threading

    done = threading.Event()

    def worker():
        x = torch.ones(3, 4)
        while not done.is_set():
            x = torch.add(x, 1).mul(0.5)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(40):
            with opscope.profile(record_shapes=record_shapes) as prof:
                torch.ones(2).sub(1)
            ops = [e for e in prof.events() if e.name in ("aten::add", "aten::mul")]
            assert all(e.name.startswith("aten::") for e in prof.events()), [
                e.name for e in prof.events()]
            assert "aten::sub" in {e.name for e in prof.events()}
            assert all(e.time_range.end >= e.time_range.start for e in ops)
            if record_shapes:
                assert all(e.input_shapes[0] == [3, 4] for e in ops)
    finally:
        done.set()
        for t in threads:
            t.join()


def test_operators_deregistered_while_recording_keep_their_names(native_only):
    """Each deregistration moves the names epoch: threads forget the schema names they
    cached (a new operator's schema may take a freed one's address) and go on recording."""
    x = torch.ones(2)
    with opscope.profile() as prof:
        for i in range(6):
            lib = torch.library.Library("opscope_epoch", "FRAGMENT")
            lib.define(f"op{i}(Tensor x) -> Tensor")
            lib.impl(f"op{i}", lambda t: t * 3, "CPU")
            getattr(torch.ops.opscope_epoch, f"op{i}")(x)
            torch.add(x, 1)
            lib._destroy()
        torch.add(x, 2)
    names = [e.name for e in prof.events()]
    assert [n for n in names if n.startswith("opscope_epoch::")] == [
        f"opscope_epoch::op{i}" for i in range(6)]
    assert names.count("aten::add") == 7 and names.count("aten::mul") == 6
