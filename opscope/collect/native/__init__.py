"""The native collectors: C++ observers built against the running torch, and their builder.

- ``collector``: ``NativeCollector``, the RecordFunction observer (``observer.cpp`` and
  its headers in ``observer/``);
- ``build``, ``build_cache``, ``build_worker``: build a C++ extension once per torch and
  source (``NativeExtension``), cache it on disk, compile in a child process;
- ``cupti``: the device collector (``cupti_observer.cpp``);
- ``execution_trace``: the execution trace's observer (``et_observer.cpp``).
"""
