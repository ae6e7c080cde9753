"""A multi-rank job analysed as one: its ranks' traces, as ``opscope.load`` reads them.

- ``facts``: each rank's trace reduced to the facts the analysis needs (``load_ranks``);
- ``checks``: the checks on rank traces before they add up (one run, bounded ranks, times);
- ``analyse``: ``analyse_ranks``, collectives matched across ranks, stragglers, desync;
- ``collective_keys``: the ranks' collectives lined up by group and sequence number;
- ``stragglers``: ranks late at collectives beyond the job's noise;
- ``job``: the report's view of a job (``load_job``: facts, steps, one session);
- ``hangs``: a hang named from the ranks' live states.

The files (which traces a folder holds, the rank a file names) are ``opscope.load.ranks``.
"""
