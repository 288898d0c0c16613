"""The last stage: what a batch leaves. Finalization merges the parts into the output and error files
(``finalize``), the results of a running batch are served as they come (``live``), failed lines are run again
(``rerun``, ``rerun_input``), and the data lifecycle sweeps prune history and collect part blobs
(``retention``) and tell files which of the pipeline's files are still needed (``file_use``). Used by the
batches app only."""
