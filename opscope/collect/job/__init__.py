"""What a rank of a torch.distributed job collects about the job, through torch and c10d.

- ``store``: the job's own c10d store, as opscope's background threads use it;
- ``clock_sync``: this rank's clock offset to rank 0, through that store;
- ``flight_recorder``: torch's flight recorder read at a recording's stop;
- ``live_collectives``: this rank's collectives as they stand now (hang watching);
- ``process_group_calls``: the process-group calls the job's Python makes while recording.
"""
