"""The profiler API: ``opscope.profile`` and what a finished profile offers.

- ``profiler``: ``opscope.profile``, the torch.profiler API conducting a collector;
- ``options``: what ``opscope.profile`` checks at construction and writes into a trace's
  metadata;
- ``results``: what a stopped profile offers (its session, tables and output files);
- ``fork``: one running profile per process, and what a forked child does with it;
- ``session_profile``: a saved profile with a live one's results API (``opscope.load``).

Users reach these through the package (``opscope.profile``, ``opscope.load``, ...).
"""
