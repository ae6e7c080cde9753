"""The names torch gives its profiler events, spelled once.

opscope's tables and traces must use torch.profiler's exact spellings, and the
analysis recognises torch's own events by them; every module takes them from here.

    >>> f"{PROFILER_STEP}#3".startswith(PROFILER_STEP_PREFIX)
    True
    >>> (EVALUATE_FUNCTION_PREFIX + "AddmmBackward0")[len(EVALUATE_FUNCTION_PREFIX):]
    'AddmmBackward0'
"""

from __future__ import annotations

PROFILER_STEP = "ProfilerStep"              # one range per profile.step(): ProfilerStep#N
PROFILER_STEP_PREFIX = PROFILER_STEP + "#"
PROFILER_STEP_WILDCARD = PROFILER_STEP + "*"  # how torch's tables name the steps together
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"     # one range per optimizer.step(): ...#SGD.step
MEMORY_EVENT = "[memory]"                   # an allocation made outside any op
AUTOGRAD_ENGINE_PREFIX = "autograd::engine::"  # ranges the autograd engine records
# autograd's wrapper around each backward node: "<prefix><NodeName>"
EVALUATE_FUNCTION = AUTOGRAD_ENGINE_PREFIX + "evaluate_function"
EVALUATE_FUNCTION_PREFIX = EVALUATE_FUNCTION + ": "

# torch.distributed. The trace metadata key of a rank's process-group facts
# ({"backend", "rank", "world_size", "pg_config": [{"pg_name", "ranks", ...}]}).
DISTRIBUTED_INFO_KEY = "distributedInfo"
# opscope's own metadata key: ns to ADD to this rank's Unix times to get rank 0's clock
CLOCK_OFFSET_KEY = "opscopeClockOffsetNs"
# opscope's own metadata key of a merged job trace (opscope merge): the ranks it holds.
# Written before traceEvents, so a reader finds it in the file's first bytes.
MERGED_RANKS_KEY = "opscopeMergedRanks"
# opscope's own metadata key: the flight recorder's collectives of the window, as rows
# [group name, collective_seq_id, profiling name, time created (Unix ns)]
# torch.compile'd code's ranges: a graph's call (the key is its FX-graph cache key), the
# autograd functions that run a forward and a backward graph, a Dynamo frame's region
COMPILED_CALL_PREFIX = "## Call CompiledFxGraph "
COMPILED_FORWARD = "CompiledFunction"
COMPILED_BACKWARD = "CompiledFunctionBackward"
COMPILED_FRAME_PREFIX = "Torch-Compiled Region"
# Dynamo's guard check before a compiled frame runs, the AOT wrappers' own ranges around a
# graph call, and the compile of a frame ("dynamo" with a "dynamo_data: compile_id=0/1" child)
DYNAMO_CACHE_LOOKUP = "TorchDynamo Cache Lookup"
AOT_WRAPPER_PREFIXES = ("Pregraph bytecode", "AOTDispatcher Runtime Wrapper")
DYNAMO_COMPILE = "dynamo"
DYNAMO_COMPILE_DATA_PREFIX = "dynamo_data: compile_id="
# Dynamo's name of the code that resumes a frame after a graph break at line N
DYNAMO_RESUME_PREFIX = "torch_dynamo_resume_in_"


def compiled_graph_key(name: str) -> str:
    """The graph key of a ``## Call CompiledFxGraph <key> ##`` range name.

    >>> compiled_graph_key("## Call CompiledFxGraph fabc123 ##")
    'fabc123'
    """
    return name[len(COMPILED_CALL_PREFIX):].strip("# ")


# a live recording's: Dynamo's graph breaks so far in the process, JSON {reason: count}
GRAPH_BREAKS_KEY = "opscopeGraphBreaks"
# a live recording's: Dynamo's compiles so far in the process, JSON {compile id: {"name",
# "file", "line", "guards", "recompile_reason", "break_reasons"}} (analysis.compiled_frames)
COMPILED_FRAMES_KEY = "opscopeCompiledFrames"
FLIGHT_RECORDER_KEY = "opscopeFlightRecorder"
# a live recording's: the process-group calls its Python made (collect.job.process_group_calls)
PROCESS_GROUP_CALLS_KEY = "opscopeProcessGroupCalls"
# Collectives as each layer names them. The calling thread's dispatcher op
# ("c10d::allreduce_", timing only the enqueue of an async op), the backend's
# range spanning the real work ("gloo:all_reduce" on gloo's worker thread,
# "nccl:all_reduce"), NCCL's device kernel ("ncclDevKernel_AllReduce_RING_LL")
# and the ``record_param_comms`` range that carries its name in args.
C10D_PREFIX = "c10d::"
COLLECTIVE_RANGE_PREFIXES = ("gloo:", "nccl:")
NCCL_KERNEL_PREFIXES = ("ncclKernel_", "ncclDevKernel_")
RECORD_PARAM_COMMS = "record_param_comms"
# A collective's name with the layer prefix, underscores, "base", "coalesced" and
# "into_tensor" taken out and lower-cased -> the kind opscope reports.
COLLECTIVE_KINDS = {
    "allreduce": "allreduce", "sparseallreduce": "allreduce", "broadcast": "broadcast",
    "allgather": "allgather", "reducescatter": "reduce_scatter", "alltoall": "alltoall",
    "barrier": "barrier", "monitoredbarrier": "barrier", "reduce": "reduce",
    "gather": "gather", "scatter": "scatter", "send": "send", "recv": "recv",
    "recvanysource": "recv", "sendrecv": "sendrecv",
}
POINT_TO_POINT_KINDS = frozenset({"send", "recv", "sendrecv"})
